#!/bin/sh
# privstream's container entrypoint (deploy/README.md).
#
#   entrypoint.sh [FLAG ...]        privstream run --config "$PRIVSTREAM_CONFIG" (every stream
#                                   of a flow file), or privstream run "$PRIVSTREAM_FAMILY" (one
#                                   stream, chosen by FLAG ...: mechanisms, topics, ε, w), with
#                                   the production fixed parts below
#   entrypoint.sh audit [FLAG ...]  privstream audit FLAG ... (the audit CronJob)
#   entrypoint.sh clock [FLAG ...]  privstream clock --config "$PRIVSTREAM_CONFIG": the flow's
#                                   slot clock (the clock Deployment), with the clock key from
#                                   PRIVSTREAM_CLOCK_KEY_FILE and PRIVSTREAM_SLOT_SECONDS
#   entrypoint.sh --help            this text and privstream's help
#
# The fixed parts of a flow, each overridable from the environment (default in brackets):
#   PRIVSTREAM_CONFIG                 a flow file (deploy/flow.toml, from a ConfigMap); or
#   PRIVSTREAM_FAMILY                 the family of a one-stream flow, e.g. ldp-ids
#   PRIVSTREAM_SECRET_FILE            the noise key, mounted from a Secret
#                                     [/var/run/secrets/privstream/noise.key]
#   PRIVSTREAM_RECOVERY_DIR           the recovery store, on the persistent volume
#                                     [/var/lib/privstream/recovery]
#   PRIVSTREAM_METRICS_ADDR/_PORT     public metrics [0.0.0.0:9100]; cluster member i: +i
#   PRIVSTREAM_INTERNAL_METRICS_ADDR/_PORT
#                                     internal metrics: true counts, operators' Prometheus
#                                     only (a NetworkPolicy guards it) [0.0.0.0:9200]; +i
# Kafka: privstream reads PRIVSTREAM_BOOTSTRAP and PRIVSTREAM_KAFKA_<PROPERTY> itself.
#
# A flow refuses to start (exit 2) without a non-empty key file: privstream would otherwise
# stop on the same error, but later and with less advice. The key itself is never printed.
# `exec` makes privstream the process that receives SIGTERM: it drains, snapshots, exits 0.
set -eu

fail() {
    printf 'privstream-entrypoint: %s\n' "$*" >&2
    exit 2
}

usage() {
    sed -n '2,25s/^# \{0,1\}//p' "$0"
}

case "${1:-}" in
audit)
    shift
    exec privstream audit "$@"
    ;;
clock)
    shift
    clock_key=${PRIVSTREAM_CLOCK_KEY_FILE:-/var/run/secrets/privstream-clock/clock.key}
    [ -s "$clock_key" ] || fail "the clock key file $clock_key is missing or empty; create" \
        "the clock's Secret (deploy/kubernetes/clock.yaml says how)"
    [ -n "${PRIVSTREAM_CONFIG:-}" ] || fail "set PRIVSTREAM_CONFIG to the flow file"
    exec privstream clock --config "$PRIVSTREAM_CONFIG" --clock-key-file "$clock_key" \
        --slot-seconds "${PRIVSTREAM_SLOT_SECONDS:-60}" "$@"
    ;;
-h | --help)
    if [ -n "${PRIVSTREAM_FAMILY:-}" ]; then
        exec privstream run "$PRIVSTREAM_FAMILY" --help
    fi
    usage
    exec privstream --help
    ;;
esac

config=${PRIVSTREAM_CONFIG:-}
family=${PRIVSTREAM_FAMILY:-}
[ -n "$config" ] || [ -n "$family" ] ||
    fail "set PRIVSTREAM_CONFIG to a flow file, or PRIVSTREAM_FAMILY to the family of a one-stream flow (privstream run --help lists them)"
[ -z "$config" ] || [ -f "$config" ] || fail "the flow file $config (PRIVSTREAM_CONFIG) does not exist; mount it from a ConfigMap"

secret_file=${PRIVSTREAM_SECRET_FILE:-/var/run/secrets/privstream/noise.key}
if [ ! -f "$secret_file" ] || [ ! -s "$secret_file" ]; then
    fail "refusing to start: the noise key file $secret_file is missing or empty; create" \
        "the flow's Secret once and mount it there (deploy/README.md, 'The noise key')"
fi
[ -r "$secret_file" ] || fail "refusing to start: the noise key file $secret_file is not" \
    "readable by uid $(id -u) (mount the Secret with the pod's fsGroup)"

if [ -n "$config" ]; then
    set -- --config "$config" "$@"
else
    set -- "$family" "$@"
fi
exec privstream run "$@" \
    --secret-file "$secret_file" \
    --recovery-dir "${PRIVSTREAM_RECOVERY_DIR:-/var/lib/privstream/recovery}" \
    --metrics-addr "${PRIVSTREAM_METRICS_ADDR:-0.0.0.0}" \
    --metrics-port "${PRIVSTREAM_METRICS_PORT:-9100}" \
    --internal-metrics-addr "${PRIVSTREAM_INTERNAL_METRICS_ADDR:-0.0.0.0}" \
    --internal-metrics-port "${PRIVSTREAM_INTERNAL_METRICS_PORT:-9200}" \
    --no-progress
