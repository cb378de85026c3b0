#!/usr/bin/env bash
# The tessera binary ($TSR_TEST_BIN) with `--backend $TSR_TEST_BACKEND` after the
# subcommands that take one (tests/cli/on_backend.sh sets both).
case "${1:-}" in
generate | run | bench | fidelity) exec "$TSR_TEST_BIN" "$1" --backend "$TSR_TEST_BACKEND" "${@:2}" ;;
*) exec "$TSR_TEST_BIN" "$@" ;;
esac
