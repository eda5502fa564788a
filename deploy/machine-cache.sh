#!/usr/bin/env bash
# Runs an install once per machine, not once per clone: the install lands in a per-machine cache
# (${XDG_CACHE_HOME:-$HOME/.cache}/rollway/NAME-KEY) and LINK points at it. CI clones afresh for
# every run; the two SGLang virtualenvs and the compose one took 2.6 min of each `make test` on a
# quiet 2-core machine (72 + 71 + 15 s) and 8 min on a loaded one (293 + 178 + 10 s); cached, 5 s.
#
#   deploy/machine-cache.sh LINK INPUT... -- INSTALLER ARG...
#   e.g. deploy/machine-cache.sh .cache/compose-v1 deploy/compose-v1/install.sh -- deploy/compose-v1/install.sh
#
# The installer is run as `INSTALLER ARG... DIR` and must make DIR whole or fail. KEY hashes what
# defines the install: the installer's command words, the interpreter that makes the virtualenv
# ($PYTHON), and the contents of each INPUT (a file, or every file under a folder). A cached
# install is reused only when its stamp holds that same key; the stamp is written after the
# installer succeeds, so a stale or half-finished install is never used (it is made again).
# Virtualenvs are not relocatable, so the installer writes straight into the cache folder, under a
# lock that makes a second clone on the machine wait for the first instead of installing twice.
set -euo pipefail
usage="usage: machine-cache.sh LINK INPUT... -- INSTALLER ARG..."
link="${1:?${usage}}"
shift
inputs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
	inputs+=("$1")
	shift
done
[ "${1:-}" = "--" ] && [ $# -ge 2 ] || { echo "${usage}" >&2; exit 2; }
shift
installer=("$@")
# Long enough for the slowest install seen (~5 min, on a loaded machine) several times over.
lock_seconds="${ROLLWAY_CACHE_LOCK_SECONDS:-1800}"

key() {
	printf 'installer: %s\n' "${installer[*]}"
	"${PYTHON:-python3}" -c 'import sys; print("python:", sys.executable, sys.version)'
	local input
	for input in "${inputs[@]}"; do
		[ -e "${input}" ] || { echo "machine-cache: no such input: ${input}" >&2; return 1; }
		# Paths relative to the input so the key is the same in every clone.
		(cd "$(dirname "${input}")" && find "$(basename "${input}")" -type f -not -name '*.pyc' \
			-not -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
	done
}

key="$(key | sha256sum | cut -c1-64)"
root="${XDG_CACHE_HOME:-${HOME}/.cache}/rollway"
dir="${root}/$(basename "${link}")-${key:0:16}"
mkdir -p "${root}" "$(dirname "${link}")"
# A real folder at LINK is a per-clone install from before the cache: replaced by the link, unless
# LINK's folder is itself a link (a clone sharing another's .cache: that install is not this one's).
if [ -e "${link}" ] && [ ! -L "${link}" ]; then
	[ ! -L "$(dirname "${link}")" ] || { echo "machine-cache: ${link} is another clone's install" >&2; exit 1; }
	rm -rf "${link}"
fi

exec 9>"${dir}.lock"
flock -w "${lock_seconds}" 9 || { echo "machine-cache: ${dir} stayed locked ${lock_seconds} s" >&2; exit 1; }
if [ "$(cat "${dir}/.machine-cache-key" 2>/dev/null)" = "${key}" ]; then
	echo "machine-cache: ${link} -> ${dir} (cached)"
else
	# Whatever LINK pointed at is not what is defined now: unlinked, so a failed install leaves none.
	[ -L "${link}" ] && rm -f "${link}"
	rm -rf "${dir}"
	started=${SECONDS}
	"${installer[@]}" "${dir}"
	echo "${key}" >"${dir}/.machine-cache-key"
	echo "machine-cache: ${link} -> ${dir} (installed in $((SECONDS - started)) s)"
fi
ln -sfn "${dir}" "${link}"
