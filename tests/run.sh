#!/usr/bin/env bash
# Run coterie's tests on a fresh machine: all the set-up, then pytest.
#
#   tests/run.sh                        the whole suite (pytest -q)
#   tests/run.sh tests/test_docs.py -x  arguments go to pytest
#   tests/run.sh --setup-only           the set-up alone
#
# The set-up is idempotent (a second run installs nothing it already has):
#   1. Debian's bubblewrap (shell commands run inside it), chromium (the chat
#      page's browser tests) and node with npm: apt-get, as root or through
#      sudo without a password, and only what is missing;
#   2. the virtual environment .venv with the project and its dev extra;
#   3. the npm packages the tests talk to, pinned (their names and tool
#      names are asserted): claude-agent-acp (the ACP tests run Claude Code
#      through it; it bundles its agent, nothing is fetched at run time) into
#      .acp-agents/, and the reference MCP server "everything" into
#      .mcp-servers/;
#   4. Arize Phoenix, pinned, in a virtual environment of its own
#      (.otlp-receiver/: it is large and its dependencies are not ours): the
#      OTLP receiver the tracing tests send spans to and read back.
# Outside CI, a piece that cannot be installed is named at the end of the
# set-up and the tests that need it skip. In CI (CI=1, as .ci/run sets it)
# it is a failure: CI must not pass by skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

ACP_AGENT="@zed-industries/claude-agent-acp@0.23.1"
MCP_SERVER="@modelcontextprotocol/server-everything@2026.8.31"
PHOENIX="arize-phoenix==20.26.1"
CHROMIUM="${COTERIE_CHROMIUM:-/usr/bin/chromium}"

setup_only=0
if [ "${1:-}" = "--setup-only" ]; then
  setup_only=1
  shift
fi

say() { echo "tests/run.sh: $*" >&2; }
not_installed=()

# -- 1. Debian packages ---------------------------------------------------------
packages=()
command -v bwrap >/dev/null 2>&1 || packages+=(bubblewrap)
[ -x "$CHROMIUM" ] || packages+=(chromium)
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)
if [ "${#packages[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    as_root=(none)
  fi
  if [ "${as_root[*]-}" = "none" ] || ! command -v apt-get >/dev/null 2>&1; then
    say "cannot install ${packages[*]} here (needs apt-get, as root or with sudo):" \
      "apt-get install -y ${packages[*]}"
  else
    say "installing ${packages[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    if ! { "${as_root[@]}" apt-get update -qq &&
      "${as_root[@]}" apt-get install -y -qq "${packages[@]}" >/dev/null; }; then
      say "apt-get could not install all of: ${packages[*]}"
    fi
  fi
  command -v bwrap >/dev/null 2>&1 || not_installed+=("bubblewrap (the sandbox tests)")
  [ -x "$CHROMIUM" ] || not_installed+=("chromium at $CHROMIUM (the chat page's browser tests)")
fi

# -- 2. the virtual environment -------------------------------------------------
[ -x .venv/bin/python ] || python3 -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q -e '.[dev]'

# -- 3. npm packages ------------------------------------------------------------
# npm_package PREFIX NAME@VERSION: install unless that version is there already.
npm_package() {
  local prefix=$1 spec=$2
  local name=${spec%@*} version=${spec##*@}
  local manifest="$prefix/node_modules/$name/package.json"
  if [ -f "$manifest" ] && command -v node >/dev/null 2>&1 &&
    [ "$(node -p "require('./$manifest').version" 2>/dev/null)" = "$version" ]; then
    return 0
  fi
  command -v npm >/dev/null 2>&1 || return 1
  say "installing $spec into $prefix/ (npm)"
  npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "$spec" >/dev/null
}
npm_package .acp-agents "$ACP_AGENT" ||
  not_installed+=("$ACP_AGENT in .acp-agents/ (the ACP tests)")
npm_package .mcp-servers "$MCP_SERVER" ||
  not_installed+=("$MCP_SERVER in .mcp-servers/ (the MCP tests)")

# -- 4. the OTLP receiver -------------------------------------------------------
receiver_python=.otlp-receiver/bin/python
if ! { [ -x "$receiver_python" ] &&
  "$receiver_python" -m pip show arize-phoenix 2>/dev/null |
  grep -x "Version: ${PHOENIX##*==}" >/dev/null; }; then
  say "installing $PHOENIX into .otlp-receiver/ (pip; a few minutes)"
  { [ -x "$receiver_python" ] || python3 -m venv .otlp-receiver; } &&
    "$receiver_python" -m pip install -q "$PHOENIX" ||
    not_installed+=("$PHOENIX in .otlp-receiver/ (the tracing receiver tests)")
fi

if [ "${#not_installed[@]}" -gt 0 ]; then
  for piece in "${not_installed[@]}"; do say "not installed: $piece"; done
  if [ -n "${CI:-}" ]; then
    say "CI: every piece must be installed; their tests would otherwise be skipped"
    exit 1
  fi
  say "the tests that need those will skip"
fi
[ "$setup_only" -eq 0 ] || exit 0

# -- pytest ---------------------------------------------------------------------
rc=0
pytest -q "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  say "pytest collected no tests; that is a failure here"
  exit 1
fi
exit "$rc"
