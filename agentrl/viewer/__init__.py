"""Web viewer for run directories: `python -m agentrl.viewer RUN_DIR... [--host H] [--port P]`.

Served by aiohttp on loopback by default, from the run directories alone (no database, no
network, assets shipped in the package): runs, metric plots per step, the groups of a step,
and one or two trajectories token by token. Pages follow a run that is still training.
"""

from agentrl.viewer.server import create_app

__all__ = ["create_app"]
