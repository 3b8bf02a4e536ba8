"""Provider port and adapters: exact wire serialization, sending, and response parsing."""
