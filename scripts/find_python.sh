#!/usr/bin/env bash
# The path of a Python interpreter of version MAJOR.MINOR: pyenv's (the machine's 3.10-3.13 live
# there), else pythonMAJOR.MINOR on PATH. Fails, naming the version, when there is none.
#
#   scripts/find_python.sh 3.12
set -euo pipefail
want=$1
if command -v pyenv >/dev/null 2>&1; then
  for candidate in "$(pyenv root)"/versions/"$want".*/bin/python"$want"; do
    [ -x "$candidate" ] && { echo "$candidate"; exit 0; }
  done
fi
if command -v "python$want" >/dev/null 2>&1 && "python$want" -c 'import sys' >/dev/null 2>&1; then
  command -v "python$want"
  exit 0
fi
echo "scripts/find_python.sh: no Python $want here (pyenv install $want, or put python$want on PATH)" >&2
exit 1
