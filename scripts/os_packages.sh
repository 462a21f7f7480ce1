#!/usr/bin/env bash
# The Debian packages LAC needs besides Python packages, in one place. Installs only the missing ones.
#
#   scripts/os_packages.sh                # the list below
#   scripts/os_packages.sh ENTRY ...      # the list below plus more entries
#   scripts/os_packages.sh openjdk-17-jre-headless:java   # plus Java 17 for Spark (lac-curator[spark]; scripts/test.sh)
#
# An entry is PACKAGE (needed unless dpkg lists it as installed) or PACKAGE:COMMAND (needed only when
# COMMAND is not on the PATH, so any provider will do: e.g. `default-jre-headless:java` is skipped when
# some JDK already provides `java`). Runs apt-get as root, or through sudo otherwise; runs
# `apt-get update` only when the package lists are missing or do not know a package, or an install
# fails. LAC_SKIP_OS_PACKAGES=1 skips this step (install the equivalents yourself on other systems).
set -euo pipefail

LAC_OS_PACKAGES=(
  wordnet-base   # WordNet 3.0 glosses and example sentences, /usr/share/wordnet (user corpus; WordNet license)
  dict-gcide     # GCIDE dictionary, /usr/share/dictd/gcide.dict.dz (user corpus; GPL); depends on dictd
  dict-foldoc    # FOLDOC, /usr/share/dictd/foldoc.dict.dz (the second user corpus, lac eval e2e; GFDL)
  fortunes-min   # fortune cookies, /usr/share/games/fortunes (user corpus; BSD)
  fortunes
)

say() { echo "os_packages: $*"; }
fail() { echo "os_packages: ERROR: $*" >&2; exit 1; }

if [ "${LAC_SKIP_OS_PACKAGES:-0}" = "1" ]; then
  say "skipped (LAC_SKIP_OS_PACKAGES=1)"
  exit 0
fi

entries=("${LAC_OS_PACKAGES[@]}" "$@")
packages=()
for entry in "${entries[@]}"; do packages+=("${entry%%:*}"); done

is_satisfied() {  # entry
  local pkg=${1%%:*}
  if [[ $1 == *:* ]]; then
    command -v "${1#*:}" >/dev/null 2>&1
  else
    [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" = "install ok installed" ]
  fi
}

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  missing=()
  for entry in "${entries[@]}"; do
    [[ $entry == *:* ]] && command -v "${entry#*:}" >/dev/null 2>&1 && continue
    missing+=("${entry%%:*}")
  done
  [ ${#missing[@]} -eq 0 ] && exit 0
  fail "this is not a Debian/Ubuntu system (no apt-get/dpkg-query). Install the equivalent of: ${missing[*]}
  (WordNet 3.0 data in /usr/share/wordnet, GCIDE in /usr/share/dictd, fortune cookies in /usr/share/games/fortunes,
  a Java 17+ runtime on the PATH for Spark, a PostgreSQL server's initdb and pg_ctl for the storage tests:
  \$LAC_PG_BIN names their directory),
  then rerun with LAC_SKIP_OS_PACKAGES=1."
fi

needed=()
for entry in "${entries[@]}"; do
  is_satisfied "$entry" || needed+=("${entry%%:*}")
done
if [ ${#needed[@]} -eq 0 ]; then
  say "present: ${entries[*]}"
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 \
    || fail "not root and sudo is missing: as root, run apt-get install ${needed[*]}"
  if [ -t 0 ]; then SUDO=(sudo); else SUDO=(sudo -n); fi
fi
apt() { "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300 "$@"; }

lists_known() {  # every needed package has an install candidate in the current package lists
  local p
  for p in "${needed[@]}"; do
    apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [^(]' || return 1
  done
}

say "installing ${needed[*]}"
updated=0
if ! lists_known; then
  apt update -qq || fail "apt-get update failed (are you root, or allowed to sudo? is a Debian mirror reachable?)"
  updated=1
fi
if ! apt install -y -qq --no-install-recommends "${needed[@]}"; then
  # Stale package lists are the usual cause: refresh once and retry.
  if [ "$updated" = 1 ] || ! apt update -qq || ! apt install -y -qq --no-install-recommends "${needed[@]}"; then
    fail "could not install ${needed[*]}; as root run:
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${needed[*]}"
  fi
fi

for entry in "${entries[@]}"; do
  is_satisfied "$entry" || fail "${entry%%:*} is still missing after apt-get install"
done
say "installed ${needed[*]}"
