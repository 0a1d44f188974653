#!/bin/bash
# tests/install-deps.sh's exit status and its policy-rc.d handling, with dpkg-query, apt-get and
# sudo replaced by stubs on PATH (nothing is installed, no system file is touched):
#   1. nothing missing: status 0, apt-get not run;
#   2. a package missing, no policy file: apt-get installs exactly that package while the file
#      keeps services from starting (exit 101), the file is gone afterwards, status 0;
#   3. a package missing, a policy file already there (Debian's container images have one): it
#      stays as it was, status 0 (this case used to end the script with status 1, and with it the
#      first run of tests/run.sh and examples/mnist/demo.sh on such a machine);
#   4. apt-get fails: the script fails too, and the file it added is gone all the same.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
t=$(mktemp -d "${TMPDIR:-/tmp}/hora-install-deps.XXXXXX")
trap 'rm -rf "$t"' EXIT
mkdir "$t/bin"
cat >"$t/bin/dpkg-query" <<'EOF'
#!/bin/bash
# dpkg-query -W -f=FMT PKG: installed unless PKG is in STUB_MISSING
for m in $STUB_MISSING; do [ "$m" = "${!#}" ] && exit 1; done
printf 'install ok installed'
EOF
cat >"$t/bin/apt-get" <<'EOF'
#!/bin/bash
# records its arguments and what the policy file answered at that moment
policy=absent
[ -x "$HORA_POLICY_RC_D" ] && { "$HORA_POLICY_RC_D"; policy=$?; }
echo "apt-get $* | policy $policy" >>"$STUB_LOG"
[ "${STUB_APT_FAIL:-0}" = 1 ] && [ "$1" = install ] && exit 100
exit 0
EOF
printf '#!/bin/sh\nexec "$@"\n' >"$t/bin/sudo"
chmod +x "$t/bin/"*
export PATH="$t/bin:$PATH" STUB_LOG="$t/log" HORA_POLICY_RC_D="$t/policy-rc.d"
unset HORA_SKIP_INSTALL
errors=0
fail() { echo "FAIL: $*"; errors=$((errors + 1)); }
# run CASE: runs install-deps.sh; sets rc and log (what apt-get recorded)
run() {
  : >"$STUB_LOG"
  set +e
  bash "$src/tests/install-deps.sh" >"$t/out" 2>&1
  rc=$?
  set -e
  log=$(cat "$STUB_LOG")
  echo "-- $1: status $rc; apt-get: ${log:-not run}"
}

STUB_MISSING="" run "nothing missing"
[ $rc = 0 ] || fail "nothing missing: status $rc"
[ -z "$log" ] || fail "nothing missing: apt-get ran"

export STUB_MISSING="hwloc"
rm -f "$HORA_POLICY_RC_D"
run "hwloc missing, no policy file"
[ $rc = 0 ] || fail "status $rc, want 0: $(cat "$t/out")"
grep -qx "apt-get install -y -qq --no-install-recommends hwloc | policy 101" <<<"$log" ||
  fail "apt-get did not install hwloc alone with services held back (exit 101)"
[ ! -e "$HORA_POLICY_RC_D" ] || fail "the policy file the script added is still there"

printf '#!/bin/sh\n# the container'"'"'s own\nexit 101\n' >"$HORA_POLICY_RC_D"
chmod +x "$HORA_POLICY_RC_D"
before=$(cat "$HORA_POLICY_RC_D")
run "hwloc missing, policy file already there"
[ $rc = 0 ] || fail "with a policy file already there: status $rc, want 0"
grep -q "apt-get install .* hwloc | policy 101" <<<"$log" || fail "apt-get did not install hwloc"
[ "$(cat "$HORA_POLICY_RC_D" 2>/dev/null)" = "$before" ] || fail "the existing policy file was changed or removed"

rm -f "$HORA_POLICY_RC_D"
STUB_APT_FAIL=1 run "apt-get install fails"
[ $rc != 0 ] || fail "apt-get failed but the script returned 0"
[ ! -e "$HORA_POLICY_RC_D" ] || fail "after a failed apt-get the policy file the script added is still there"

[ $errors = 0 ] && echo "test_install_deps: passed" || echo "test_install_deps: $errors errors"
exit $((errors > 0))
