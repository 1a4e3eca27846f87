# Sourced by the bench/run_*.sh scripts: one step of a comparison run under the run's DEADLINE (seconds since the
# script began, bash's SECONDS).
# timed_step LOG NAME LEAST LIMIT DIR COMMAND...: COMMAND in DIR, with PYTHONPATH=$SITE:DIR before the caller's (SITE
# default /tmp/site, the carried wheels), under `timeout`: its stdout dropped, its stderr appended to LOG after a
# line "== NAME". Skipped when fewer than LEAST seconds are left; its limit is LIMIT seconds or what is left. Prints
# "NAME rc=CODE SECONDS s", then calls the script's own `merge` (the document is rewritten after every step).
timed_step() {
  local log=$1 name=$2 least=$3 limit=$4 dir=$5
  shift 5
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt "$least" ]; then echo "$name skipped: the deadline"; return; fi
  if [ "$limit" -gt "$left" ]; then limit=$left; fi
  local began=$SECONDS
  echo "== $name" >> "$log"
  (cd "$dir" && PYTHONPATH="${SITE:-/tmp/site}:$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout "$limit" "$@" \
     > /dev/null 2>> "$log")
  echo "$name rc=$? $((SECONDS - began)) s"
  merge
}
