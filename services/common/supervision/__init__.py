"""Process supervision a run needs while it runs: start its services (local processes or Ray
actors), watch them, restart or stop them. Shared runtime below the services (the coordinator
starts a run's services through it), so launch code (rollway.deploy) and the demo use it too
without the coordinator importing launch code."""
