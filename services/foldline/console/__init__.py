"""The operator console (``foldline console``): a read-only web page over the session log.

Sessions, a session's turns and steps with their tokens, cost and cache-read drops, header snapshots and their
diffs, the exact request body of any step with its proof, compactions and trims, tool calls and results, images,
the fleet's spend and drops — every figure rebuilt from the log with the functions the commands use
(:mod:`.data`, :mod:`.model`, :mod:`.index`), served by a Starlette app on uvicorn (:mod:`.app`, :mod:`.server`)
from server-rendered templates with every asset inside the package. It needs the ``console`` extra.
"""
