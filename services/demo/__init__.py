"""The demo: the tiny model, its addition and tool-use data, and `rollway demo` (addition.py,
tools.py) and the compose demo (compose.py). Not part of a service: it sits above the launch
code (rollway.deploy) and uses it as any user would."""
