#!/usr/bin/env bash
# System packages the Python install cannot bring: Debian's libb64 for tritonclient's perf_analyzer.
# Best effort: serving tests skip cleanly without it; everything else does not need it.
set -u
if ! ldconfig -p 2>/dev/null | grep -q 'libb64.so.0d'; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -q libb64-0d >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libb64-0d >/dev/null 2>&1; }) \
      || echo "setup-system: could not install libb64-0d (perf_analyzer benchmarks will be unavailable)"
  else
    echo "setup-system: libb64-0d missing; install it for perf_analyzer (apt-get install libb64-0d)"
  fi
fi
exit 0
