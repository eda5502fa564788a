#!/usr/bin/env bash
# Installs a pinned SGLang release for CPU serving into its own virtualenv, by the route in
# deploy/sglang-cpu/README.md: CPU torch first, SGLang without its CUDA dependency tree, the server's
# CPU-path imports from a lock file, and two import-only stand-ins (shims/) for packages with no CPU
# build on PyPI. Nothing here touches the project's .venv.
#
#   deploy/sglang-cpu/install.sh VERSION DEST     e.g. install.sh 0.5.23 .cache/sglang-0.5.23
#
# DEST/.installed is written last, so a half-finished install is redone on the next call.
set -euo pipefail
version="${1:?usage: install.sh VERSION DEST}"
dest="${2:?usage: install.sh VERSION DEST}"
here="$(cd "$(dirname "$0")" && pwd)"
lock="${here}/requirements-${version}.txt"
python="${PYTHON:-python3}"

[ -f "${lock}" ] || { echo "no lock file for SGLang ${version}: ${lock}" >&2; exit 2; }
[ -f "${dest}/.installed" ] && exit 0
rm -rf "${dest}"
"${python}" -m venv "${dest}"
pip=("${dest}/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch and triton first and pinned: any unpinned torch pulls a CUDA build of several GB.
"${pip[@]}" torch==2.13.0 triton==3.7.1
"${pip[@]}" --no-deps "sglang==${version}"
"${pip[@]}" --no-deps -r "${lock}"
rm -rf "${dest}/shims"
cp -r "${here}/shims" "${dest}/shims"
# The import the server makes first: fails here, not 40 s into a test.
SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="${dest}/shims" "${dest}/bin/python" -c "import sglang.launch_server"
echo "${version}" > "${dest}/.installed"
