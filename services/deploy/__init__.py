"""Launch code: `rollway run` (launcher.py), `rollway up` (local_processes.py) and the chaos runs
(chaos.py). What a run needs while it runs (its services' supervision, local or Ray) is shared
runtime in rollway.common.supervision."""
