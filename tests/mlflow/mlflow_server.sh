#!/usr/bin/env bash
# A real MLflow for the tests.
#   mlflow_server.sh venv VENV              install mlflow==3.17.2 into VENV (kept when present)
#   mlflow_server.sh start VENV DIR [PORT]  start `mlflow server` on 127.0.0.1 (SQLite in DIR,
#                                           served artifacts in DIR/artifacts); DIR/port, DIR/pid
#   mlflow_server.sh stop DIR               stop it (its whole process group)
set -euo pipefail
version=3.17.2

case "${1:-}" in
  venv)
    venv=$2
    if [ -x "$venv/bin/mlflow" ] && "$venv/bin/python" -c "import sys, mlflow; sys.exit(mlflow.__version__ != '$version')" 2>/dev/null; then
      echo "mlflow $version: $venv (cached)"
      exit 0
    fi
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "mlflow==$version"
    "$venv/bin/python" -c "import mlflow; print('mlflow', mlflow.__version__, 'installed')"
    ;;
  start)
    venv=$2 dir=$3 port=${4:-}
    mkdir -p "$dir/artifacts"
    if [ -z "$port" ]; then
      port=$(/usr/bin/python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    fi
    # setsid: the server and its workers form one process group, stopped together.
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid "$venv/bin/mlflow" server --host 127.0.0.1 --port "$port" \
      --workers 1 --backend-store-uri "sqlite:///$dir/db.sqlite" --artifacts-destination "$dir/artifacts" \
      >>"$dir/server.log" 2>&1 < /dev/null &
    echo $! > "$dir/pid"
    echo "$port" > "$dir/port"
    for _ in $(seq 1 240); do
      if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
        echo "mlflow server on 127.0.0.1:$port (pid $(cat "$dir/pid"))"
        exit 0
      fi
      if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then break; fi
      sleep 0.25
    done
    echo "mlflow server did not answer on port $port; its log:" >&2
    tail -30 "$dir/server.log" >&2
    exit 1
    ;;
  stop)
    dir=$2
    [ -f "$dir/pid" ] || exit 0
    pid=$(cat "$dir/pid")
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do
      kill -0 -- "-$pid" 2>/dev/null || break
      sleep 0.25
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$dir/pid"
    ;;
  *)
    echo "usage: $0 venv VENV | start VENV DIR [PORT] | stop DIR" >&2
    exit 2
    ;;
esac
