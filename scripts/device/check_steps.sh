# The step runner the device checks share (scripts/gpu_check.sh and
# scripts/device/cores_check.sh), sourced by them: `begin` sets a check up, `step` runs one
# of its steps. A step needs what `begin` set and a write_summary function.
#
# begin NAME CAP: unpacks the bundle .pack/NAME.tar.xz where it came (it travels packed),
# makes $OUT (default /tmp/NAME-check), and sets $cap (CAP, the check's budget in seconds),
# $start (now, in $SECONDS), $work (a scratch folder the caller removes at exit), $steps
# and $figures (the steps and figures tables, empty).
begin() {
  local name=$1
  if [ -f ".pack/$name.tar.xz" ]; then
    tar xJf ".pack/$name.tar.xz" 2>/dev/null ||
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall()' ".pack/$name.tar.xz"
  fi
  OUT=${OUT:-/tmp/$name-check}
  mkdir -p "$OUT"
  cap=$2
  start=$SECONDS
  work=$(mktemp -d "/tmp/$name-check-work.XXXXXX")
  steps="$work/steps.md"
  figures="$work/figures.md"
  : >"$steps"
  : >"$figures"
}

# step NAME SECONDS LOG COMMAND...: COMMAND under `timeout` (SECONDS, or what is left of
# the check), its output appended to $OUT/LOG, its status in the steps table and its
# SUMMARY lines in the figures table; write_summary after every step.
step() {
  local name=$1 limit=$2 logname=$3 log=$OUT/$3
  shift 3
  local left=$((cap - (SECONDS - start) - 5))
  if [ "$left" -lt 10 ]; then
    echo "| $name | skipped: the check's $cap s were spent | | |" >>"$steps"
    write_summary
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s, $(date -u +%T))" >>"$log"
  timeout -k 5 "$limit" "$@" >"$work/step.out" 2>&1
  local rc=$?
  cat "$work/step.out" >>"$log"
  sed -n 's/^SUMMARY //p' "$work/step.out" >>"$figures"
  local status=ok
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status="TIMED OUT after ${limit}s"
  [ "$rc" -ne 0 ] && [ "$status" = ok ] && status="FAILED (exit $rc)"
  echo "| $name | $status | $((SECONDS - t0)) s | $logname |" >>"$steps"
  write_summary
}
