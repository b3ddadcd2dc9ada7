# Sourced by the scripts in this folder: the repository root, the interpreter and DRY_RUN.

# The repository root, where every relative path of the scripts starts: the folder above this file.
cd "$(dirname "${BASH_SOURCE[0]}")/.." \
    || { echo "$0: cannot find the repository root; sbatch this script from it" >&2; exit 1; }

# The interpreter: $PYTHON, else the project's virtual environment, else `python` on the PATH.
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi

# True under DRY_RUN=1 (any value but empty or 0): print the commands instead of running them.
dry_run() { [[ -n ${DRY_RUN:-} && $DRY_RUN != 0 ]]; }

# The arguments as one shell line, each single-quoted only where the shell would change it.
quoted() {
    local arg line=()
    for arg in "$@"; do
        if [[ $arg =~ ^[A-Za-z0-9_./=,:+@%-]+$ ]]; then
            line+=("$arg")
        else
            line+=("'${arg//\'/\'\\\'\'}'")
        fi
    done
    echo "${line[*]}"
}

# Runs a command, or under DRY_RUN prints it.
run() {
    if dry_run; then quoted "$@"; else "$@"; fi
}

# Prints a progress line; under DRY_RUN as a comment, so that the output stays a shell script.
say() {
    if dry_run; then echo "# $*"; else echo "$*"; fi
}
