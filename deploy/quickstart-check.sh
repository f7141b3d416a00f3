#!/usr/bin/env bash
# Run the CPU quickstart of deploy/compose.cpu.yaml for real, once, end to end:
#
#   1. a Docker engine: the running one, or (root, none running) dockerd started here and stopped
#      at the end; its flags are DOCKERD_ARGS;
#   2. the base images the compose file and deploy/Dockerfile name (python:3.11-slim,
#      redis:7-alpine): used when present; when missing and QUICKSTART_BASE=debian (the default),
#      stand-ins are built from a debootstrap'd Debian (deploy/quickstart/*.Dockerfile), for hosts
#      that cannot reach Docker Hub; QUICKSTART_BASE=pull pulls them instead;
#   3. the torch CPU wheel: TORCH_CPU_INDEX when set (a mirror of PyTorch's CPU index); else, when
#      pip's find-links hold torch-2.13.0+cpu, a PEP 503 index of that wheel served on loopback; else
#      the Dockerfile's default (download.pytorch.org);
#   4. docker build of deploy/Dockerfile (respgate:cpu), with the host's network (SKIP_BUILD=1 and
#      an image of that name present: use it as it is);
#   5. compose up of the respgate service (and redis, which it depends on), wait for /readyz,
#      `respgate smoke http://127.0.0.1:8000` from the image (RESPGATE_BIN=path/to/respgate to use
#      a host install), then compose down -v (KEEP_RUNNING=1 leaves it up).
#
# Idempotent: images present are reused, docker's build cache makes a rebuild quick, a leftover
# project of an earlier run is taken down first. Every step is bounded by a timeout. Prints the
# time of each step and the image size. Prometheus and Grafana are not started (their images are
# not built here). Run from anywhere: `sudo deploy/quickstart-check.sh` (root only for dockerd and
# debootstrap). Exit 0 when the smoke passed.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COMPOSE_FILE="$REPO/deploy/compose.cpu.yaml"
PROJECT=${QUICKSTART_PROJECT:-respgate-quickstart-check}
IMAGE=respgate:cpu
PYTHON_IMAGE=$(awk 'toupper($1) == "FROM" {print $2; exit}' "$REPO/deploy/Dockerfile")
REDIS_IMAGE=$(awk '/^  redis:/ {r = 1} r && $1 == "image:" {print $2; exit}' "$COMPOSE_FILE")
QUICKSTART_BASE=${QUICKSTART_BASE:-debian}
DEBIAN_BASE=${DEBIAN_BASE:-local/bookworm:min}
DEBIAN_SUITE=${DEBIAN_SUITE:-bookworm}
DOCKERD_ARGS=${DOCKERD_ARGS:---iptables=false --bridge=none}  # storage: dockerd picks overlay2, else vfs
TORCH_WHEEL=torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
TORCH_INDEX_PORT=${TORCH_INDEX_PORT:-18080}   # fixed: the build arg is part of docker's cache key
GATEWAY=http://127.0.0.1:8000                 # compose.cpu.yaml publishes 8000:8000
BASE_TIMEOUT=${BASE_TIMEOUT:-600}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-2400}
READY_TIMEOUT=${READY_TIMEOUT:-600}
SMOKE_TIMEOUT=${SMOKE_TIMEOUT:-600}
KEEP_RUNNING=${KEEP_RUNNING:-0}
SKIP_BUILD=${SKIP_BUILD:-0}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/respgate-quickstart.XXXXXX")
DOCKERD_PID="" INDEX_PID="" UP=0 TIMES=""

log() { printf '[quickstart-check %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
timed() {  # timed LABEL CMD...: run CMD, add "LABEL Ns" to the summary
    local label=$1 t0=$SECONDS; shift
    "$@"
    TIMES+="$label $((SECONDS - t0))s"$'\n'
}

cleanup() {
    local rc=$?
    set +e
    if [ "$UP" = 1 ] && [ "$KEEP_RUNNING" != 1 ]; then
        log "compose down"
        timeout 120 "${COMPOSE[@]}" down -v --remove-orphans >/dev/null 2>&1
    fi
    if [ -n "$INDEX_PID" ]; then kill "$INDEX_PID" 2>/dev/null; wait "$INDEX_PID" 2>/dev/null; fi
    if [ -n "$DOCKERD_PID" ]; then
        log "stopping the dockerd started here (pid $DOCKERD_PID)"
        kill "$DOCKERD_PID" 2>/dev/null
        for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
    fi
    rm -rf "$WORK"
    [ -n "$TIMES" ] && printf '%s' "$TIMES" | sed 's/^/  /' >&2
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

http_status() {  # the HTTP status of GET $1, 000 when there is no answer
    python3 - "$1" <<'EOF'
import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print("000")
EOF
}

# -- 1. the engine ---------------------------------------------------------------------------------
start_engine() {
    if timeout 20 docker info >/dev/null 2>&1; then return; fi
    if [ "$(id -u)" != 0 ] || ! command -v dockerd >/dev/null; then
        die "no Docker engine answers and dockerd cannot be started here (needs root and dockerd)"
    fi
    log "starting dockerd $DOCKERD_ARGS"
    # shellcheck disable=SC2086  # DOCKERD_ARGS is a list of flags
    dockerd $DOCKERD_ARGS >"$WORK/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 60); do
        timeout 5 docker info >/dev/null 2>&1 && return
        kill -0 "$DOCKERD_PID" 2>/dev/null || { tail -20 "$WORK/dockerd.log" >&2; DOCKERD_PID=""; die "dockerd exited"; }
        sleep 1
    done
    die "dockerd did not answer within 60 s"
}

pick_compose() {
    if timeout 20 docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose)
    elif command -v docker-compose >/dev/null; then COMPOSE=(docker-compose)
    else die "neither 'docker compose' (v2) nor 'docker-compose' (v1) is installed"; fi
    COMPOSE+=(-p "$PROJECT" -f "$COMPOSE_FILE")
    log "compose: ${COMPOSE[*]:0:2}"
}

# -- 2. base images --------------------------------------------------------------------------------
have_image() { timeout 30 docker image inspect "$1" >/dev/null 2>&1; }

make_debian_base() {
    have_image "$DEBIAN_BASE" && return
    command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install -y debootstrap)"
    log "debootstrap $DEBIAN_SUITE -> $DEBIAN_BASE"
    local root="$WORK/rootfs"
    timeout "$BASE_TIMEOUT" debootstrap --variant=minbase "$DEBIAN_SUITE" "$root" >"$WORK/debootstrap.log" 2>&1 \
        || { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap"; }
    tar -C "$root" -c . | timeout "$BASE_TIMEOUT" docker import - "$DEBIAN_BASE" >/dev/null
    rm -rf "$root"
}

host_ca_bundle() {  # the CA bundle the host's pip is configured with, if any
    local ca=${PIP_CERT:-}
    [ -n "$ca" ] || ca=$(python3 -m pip config get global.cert 2>/dev/null || true)
    [ -n "$ca" ] && [ -f "$ca" ] && printf '%s' "$ca"
    return 0
}

stand_in() {  # stand_in IMAGE DOCKERFILE: build IMAGE from deploy/quickstart/DOCKERFILE when missing
    local image=$1 dockerfile=$2 ctx="$WORK/ctx-${2%%.*}" ca
    have_image "$image" && { log "$image: present"; return; }
    if [ "$QUICKSTART_BASE" = pull ]; then
        timeout "$BASE_TIMEOUT" docker pull "$image"
        return
    fi
    make_debian_base
    log "$image: building a stand-in from $DEBIAN_BASE (deploy/quickstart/$dockerfile)"
    mkdir -p "$ctx"
    cp "$REPO/deploy/quickstart/$dockerfile" "$ctx/Dockerfile"
    ca=$(host_ca_bundle)
    if [ -n "$ca" ]; then cp "$ca" "$ctx/host-ca.crt"; else : >"$ctx/host-ca.crt"; fi
    timeout "$BASE_TIMEOUT" docker build -q --network host --build-arg "DEBIAN_BASE=$DEBIAN_BASE" -t "$image" "$ctx" >/dev/null
}

# -- 3. the torch CPU wheel --------------------------------------------------------------------------
torch_index() {
    BUILD_ARGS=()
    if [ -n "${TORCH_CPU_INDEX:-}" ]; then BUILD_ARGS=(--build-arg "TORCH_CPU_INDEX=$TORCH_CPU_INDEX"); return; fi
    local dirs wheel="" d
    dirs="${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null || true)"
    for d in $dirs; do [ -f "$d/$TORCH_WHEEL" ] && { wheel="$d/$TORCH_WHEEL"; break; }; done
    if [ -z "$wheel" ]; then log "torch: from the Dockerfile's default index"; return; fi
    log "torch: $wheel served on 127.0.0.1:$TORCH_INDEX_PORT"
    mkdir -p "$WORK/index/torch"
    ln -s "$wheel" "$WORK/index/torch/$TORCH_WHEEL"
    printf '<!DOCTYPE html><html><body><a href="%s">%s</a></body></html>\n' "$TORCH_WHEEL" "$TORCH_WHEEL" \
        >"$WORK/index/torch/index.html"
    python3 -m http.server "$TORCH_INDEX_PORT" --bind 127.0.0.1 --directory "$WORK/index" >"$WORK/index.log" 2>&1 &
    INDEX_PID=$!
    for _ in $(seq 20); do
        [ "$(http_status "http://127.0.0.1:$TORCH_INDEX_PORT/torch/")" = 200 ] && break
        kill -0 "$INDEX_PID" 2>/dev/null || die "the torch index could not listen on 127.0.0.1:$TORCH_INDEX_PORT"
        sleep 0.5
    done
    BUILD_ARGS=(--build-arg "TORCH_CPU_INDEX=http://127.0.0.1:$TORCH_INDEX_PORT/")
}

# -- 4. build --------------------------------------------------------------------------------------
build() {
    if [ "$SKIP_BUILD" = 1 ] && have_image "$IMAGE"; then log "$IMAGE: present, not rebuilt (SKIP_BUILD=1)"; return; fi
    torch_index
    log "docker build -f deploy/Dockerfile -t $IMAGE (log: $WORK/build.log while it runs)"
    timeout "$BUILD_TIMEOUT" docker build --network host -f "$REPO/deploy/Dockerfile" "${BUILD_ARGS[@]}" \
        -t "$IMAGE" "$REPO" >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log" >&2; die "docker build"; }
}

# -- 5. up, ready, smoke ---------------------------------------------------------------------------
up() {
    [ "$(http_status "$GATEWAY/readyz")" = 000 ] || die "something already answers on $GATEWAY"
    timeout 120 "${COMPOSE[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
    UP=1
    timeout 300 "${COMPOSE[@]}" up -d --no-build respgate
}

wait_ready() {
    local deadline=$((SECONDS + READY_TIMEOUT)) cid restarts
    cid=$(timeout 30 "${COMPOSE[@]}" ps -q respgate)
    while [ "$(http_status "$GATEWAY/readyz")" != 200 ]; do
        restarts=$(timeout 30 docker inspect -f '{{.RestartCount}}' "$cid" 2>/dev/null || echo "?")
        if [ "$restarts" != 0 ] || [ $SECONDS -ge $deadline ]; then
            timeout 60 "${COMPOSE[@]}" logs --tail 60 >&2 || true
            die "respgate not ready (restarts: $restarts, waited $((SECONDS - deadline + READY_TIMEOUT)) s)"
        fi
        sleep 2
    done
}

smoke() {
    local cmd
    if [ -n "${RESPGATE_BIN:-}" ]; then cmd=("$RESPGATE_BIN")
    else cmd=(docker run --rm --network host --entrypoint respgate "$IMAGE"); fi
    timeout "$SMOKE_TIMEOUT" "${cmd[@]}" smoke "$GATEWAY" --api-key "$KEY" \
        || { timeout 60 "${COMPOSE[@]}" logs --tail 60 >&2 || true; die "respgate smoke"; }
}

start_engine
pick_compose
timed "base images:" stand_in "$PYTHON_IMAGE" python-slim.Dockerfile
timed "redis image:" stand_in "$REDIS_IMAGE" redis.Dockerfile
timed "build:" build
KEY=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
export RESPGATE_API_KEYS="quickstart:$KEY"
unset RESPGATE_OPEN_MODE
timed "compose up:" up
timed "first start to /readyz 200:" wait_ready
timed "smoke:" smoke
size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
log "PASSED: $IMAGE is $((size / 1000000)) MB; times:"
