"""foldline's loop against LangGraph: the shared step, the LangGraph side, its environment and the plot."""
