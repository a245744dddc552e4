# The step runner the device checks share (scripts/gpu_check.sh and
# scripts/device/cores_check.sh), sourced by them. It expects $cap and $start (the check's budget in seconds and when it
# began, in $SECONDS), $work (a scratch folder), $OUT, $steps and $figures (the steps and
# figures tables being built) and a write_summary function.
#
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
