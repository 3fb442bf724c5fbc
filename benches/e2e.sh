#!/usr/bin/env bash
# Prints the end-to-end table of docs/performance.md: softroce against the kernel's UDP and TCP
# paths on loopback, medians of SOFTROCE_BENCH_RUNS runs (default 5). Takes about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "<!-- $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(rustc --version) -->"
cargo bench --bench e2e 2>/dev/null | grep -E '^\||^RC|^8-byte|^Resident|^$'
