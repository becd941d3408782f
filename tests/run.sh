#!/usr/bin/env bash
# Install the test dependencies and run the whole suite (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v kcat >/dev/null 2>&1; then
  # Debian's kafkacat provides kcat, a real librdkafka client used by the e2e suite
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq kafkacat) >/dev/null || echo "warning: could not install kafkacat"
  else
    echo "warning: kcat not found (apt-get install kafkacat); its tests will be skipped"
  fi
fi
if ! command -v tmux >/dev/null 2>&1; then
  # a real terminal for `automqctl cluster top` (tests/e2e/test_cluster_top.py)
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq tmux) >/dev/null || echo "warning: could not install tmux"
  else
    echo "warning: tmux not found (apt-get install tmux); the cluster top terminal test will be skipped"
  fi
fi
if ! command -v ip >/dev/null 2>&1; then
  # network namespaces stand in for hosts (tests/e2e/test_multi_host_netns.py, needs root)
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq iproute2) >/dev/null || echo "warning: could not install iproute2"
  else
    echo "warning: ip not found (apt-get install iproute2); the multi-host namespace tests will be skipped"
  fi
fi
if ! command -v java >/dev/null 2>&1; then
  # Spark (the compaction suite) needs a JRE: Debian's openjdk-17-jre-headless
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless) >/dev/null \
      || echo "warning: could not install openjdk-17-jre-headless"
  else
    echo "warning: java not found (apt-get install openjdk-17-jre-headless); Spark tests will be skipped"
  fi
fi
pip install -q -e '.[test]'
# kafka-python 2.3.3, an older admin client users still run (tests/e2e/test_admin_apis.py),
# in a directory of its own beside the current kafka-python the broker's codec uses
OLD_KAFKA_PYTHON=tests/.clients/kafka-python-2.3.3
[ -d "$OLD_KAFKA_PYTHON/kafka" ] || pip install -q --no-deps --target "$OLD_KAFKA_PYTHON" kafka-python==2.3.3 \
  || echo "warning: could not install kafka-python 2.3.3; its admin-client test will be skipped"
# kafkajs and @platformatic/kafka, real JavaScript clients (tests/js): node from Debian when
# missing, the clients from npm
if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq nodejs npm) >/dev/null || echo "warning: could not install nodejs"
fi
if command -v npm >/dev/null 2>&1; then
  (cd tests/js && timeout 300 npm install --silent --no-audit --no-fund >/dev/null) \
    || echo "warning: npm install in tests/js failed; the JavaScript client tests will be skipped"
else
  echo "warning: npm not found; the JavaScript client tests will be skipped"
fi
# lint and format first: a lint error fails the test command (ruff's config: pyproject.toml)
ruff check .
ruff format --check .
# a private base temp dir: pytest prunes the numbered dirs of its shared default root
# (/tmp/pytest-of-$USER) when any other pytest starts, which deleted the cluster dirs of
# running e2e tests whenever another test run shared the machine
# (kept after a failure: the clusters' logs are the evidence)
BASETEMP="$(mktemp -d "${TMPDIR:-/tmp}/automq-tests.XXXXXX")"
# two worker processes (pytest-xdist) unless a test file is named: the e2e files spend most
# of their time waiting on clusters, so two at once nearly halve the run on 2 cores. A file
# stays in one worker (--dist loadfile: a module fixture's cluster starts once), the Spark
# files share one, the longest go first (tests/conftest.py orders them by
# tests/file_durations.json; xdist's own reorder by test count is off) so the workers end
# together, and as root each worker has a network namespace of its own (its clusters' ports
# cannot collide with the other's: tests/support/worker_network.py). A named file (one file,
# with -x, -k ...) runs in one process as before, so does a debugger (--pdb, --trace);
# AUTOMQ_TEST_WORKERS=0 runs all in one.
WORKERS=(-n "${AUTOMQ_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
for arg in "$@"; do
  if [ -f "${arg%%::*}" ] || [[ "$arg" == -n* || "$arg" == --numprocesses* || "$arg" == --dist* ||
    "$arg" == --pdb* || "$arg" == --trace ]]; then
    WORKERS=()
  fi
done
python -m pytest -q --basetemp="$BASETEMP/t" --junitxml="$BASETEMP/junit.xml" "${WORKERS[@]}" "$@" && rc=0 || rc=$?
if [ "$rc" -eq 0 ]; then
  rm -rf "$BASETEMP"
else
  # a digest last: client libraries' log lines (librdkafka's, of clients a failed test's
  # traceback keeps alive) can bury pytest's own summary
  python tests/failure_digest.py "$BASETEMP/junit.xml" || true
  # the evidence is the logs and small files; the clusters' WAL files and store volumes
  # (~7 GB a run) would fill the disk after a few failed runs
  find "$BASETEMP" -type f -size +1M ! -name "*.log" ! -name "*.xml" -delete 2>/dev/null || true
  echo "test files and cluster logs kept in $BASETEMP (files over 1 MB but logs deleted)"
fi
exit "$rc"
