#!/usr/bin/env bash
# The Python package's tests: builds the wheel and the `tcc` binary, installs the wheel into a
# venv under target/, and runs pytest (python/tests). Part of the README's test command.
# Needs python3 (3.9 or newer) with its venv module, and PyPI for numpy, pytest and maturin.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/py-venv
if [ ! -x "$venv/bin/python" ]; then
    if ! python3 -m venv "$venv" 2>/dev/null; then
        # Debian and Ubuntu ship the venv module separately.
        rm -rf "$venv"
        sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
        $sudo apt-get update -qq && $sudo apt-get install -y -qq python3-venv
        python3 -m venv "$venv"
    fi
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check numpy pytest "maturin>=1.9.4,<2"

rm -rf target/wheels
"$venv/bin/maturin" build --release --quiet -m python/Cargo.toml -o target/wheels
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps target/wheels/tcc-*.whl
cargo build --release --quiet --bin tcc

# From outside the checkout, so that `import tcc` finds the installed wheel, not python/tcc.
cd target
TCC_BIN="$PWD/release/tcc" "$OLDPWD/$venv/bin/python" -m pytest -q "$OLDPWD/python/tests"
