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
#                                   PRIVSTREAM_CLOCK_KEY_FILE and PRIVSTREAM_SLOT_SECONDS;
#                                   without PRIVSTREAM_CONFIG the FLAGs name --topic and --stream
#   entrypoint.sh shuffler [FLAG ...]
#                                   privstream shuffler FLAG ... (its topics, --policy): the
#                                   shuffle model's middle party, its own trust domain, with the
#                                   clock key from PRIVSTREAM_CLOCK_KEY_FILE, its store
#                                   PRIVSTREAM_SHUFFLER_STORE [/var/lib/privstream/shuffler], its
#                                   id PRIVSTREAM_SHUFFLER_ID [the host name: the pod's name] and
#                                   its metrics on PRIVSTREAM_METRICS_ADDR:
#                                   PRIVSTREAM_SHUFFLER_METRICS_PORT [0.0.0.0:9103]; it refuses
#                                   to start where it could read the noise key
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
# `exec` makes privstream the process that receives SIGTERM: a flow drains, snapshots, exits
# 0; the shuffler stops where it is (it saves its store after each delivered poll).
set -eu

fail() {
    printf 'privstream-entrypoint: %s\n' "$*" >&2
    exit 2
}

# The clock key file (the clock and the shuffler): missing or empty, exit 2 naming $1.
clock_key=${PRIVSTREAM_CLOCK_KEY_FILE:-/var/run/secrets/privstream-clock/clock.key}
need_clock_key() {
    [ -s "$clock_key" ] || fail "the clock key file $clock_key is missing or empty; create $1"
}

usage() {
    sed -n '2,/^set -eu$/s/^# \{0,1\}//p' "$0"
}

case "${1:-}" in
audit)
    shift
    exec privstream audit "$@"
    ;;
clock)
    shift
    need_clock_key "the clock's Secret (deploy/kubernetes/clock.yaml says how)"
    if [ -n "${PRIVSTREAM_CONFIG:-}" ]; then
        set -- --config "$PRIVSTREAM_CONFIG" "$@"
    fi
    exec privstream clock --clock-key-file "$clock_key" \
        --slot-seconds "${PRIVSTREAM_SLOT_SECONDS:-60}" "$@"
    ;;
shuffler)
    shift
    need_clock_key "the shuffler's Secret (deploy/kubernetes/shuffler/secret.yaml says how)"
    # Another trust domain than the server's: whoever holds the noise key can remove the noise,
    # and the shuffler knows who sent what. Never both in one pod.
    noise_key=${PRIVSTREAM_SECRET_FILE:-/var/run/secrets/privstream/noise.key}
    if [ -n "${PRIVSTREAM_SECRET:-}" ] || [ -e "$noise_key" ]; then
        fail "refusing to start: the shuffler must never hold the server's noise key" \
            "(PRIVSTREAM_SECRET is set or $noise_key exists); mount only its clock key"
    fi
    for arg in "$@"; do
        case $arg in # --secret-file, --insecure-seed and the prefixes argparse takes for them
        --se | --se=* | --sec* | --in | --in=* | --ins*)
            fail "refusing to start: the shuffler takes no $arg (its clock key comes from" \
                "PRIVSTREAM_CLOCK_KEY_FILE; it must never hold the server's noise key)"
            ;;
        esac
    done
    exec privstream shuffler --clock-key-file "$clock_key" \
        --store "${PRIVSTREAM_SHUFFLER_STORE:-/var/lib/privstream/shuffler}" \
        --shuffler-id "${PRIVSTREAM_SHUFFLER_ID:-$(uname -n)}" \
        --metrics-addr "${PRIVSTREAM_METRICS_ADDR:-0.0.0.0}" \
        --metrics-port "${PRIVSTREAM_SHUFFLER_METRICS_PORT:-9103}" "$@"
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
