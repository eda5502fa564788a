#!/usr/bin/env bash
# docker-compose 1.29 (Debian's compose v1) in its own virtualenv, so the compose tests parse the
# shipped file with it for real. PyYAML 5.4.1 (compose 1.29's pin) has no wheel for this Python:
# it builds from source, with Cython < 3 and without build isolation.
#
#   deploy/compose-v1/install.sh DEST     e.g. install.sh .cache/compose-v1
set -euo pipefail
dest="${1:?usage: install.sh DEST}"
python="${PYTHON:-python3}"

"${python}" -m venv "${dest}"
pip=("${dest}/bin/pip" install --quiet --disable-pip-version-check)
"${pip[@]}" "cython<3" wheel setuptools
"${pip[@]}" --no-build-isolation pyyaml==5.4.1
"${pip[@]}" docker-compose==1.29.2 docker==6.1.3 requests==2.31.0
"${dest}/bin/docker-compose" version
