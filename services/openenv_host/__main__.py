"""python -m rollway.openenv_host --openenv-app module:attr: serve an OpenEnv app (server.py)."""

from rollway.openenv_host.server import main

if __name__ == "__main__":
    main()
