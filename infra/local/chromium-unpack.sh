#!/usr/bin/env bash
# Unpacks Debian's Chromium and the shared libraries it lacks on this machine into DIR, without
# root (called by scripts/setup chromium): `apt-get download` fetches the .deb files from the
# machine's configured apt sources, `dpkg -x` unpacks them into DIR/root. Then, until ldd reports
# nothing missing for the browser and every library unpacked so far: for each missing soname, the
# package that provides it is found among the not-installed dependencies of the package whose file
# needs it, then among those of every unpacked package (Debian's naming first, libFOO.so.N ->
# libfooN / libfoo-N; else each candidate's file list), downloaded and unpacked. Writes DIR/bin/chromium, a wrapper that runs the browser with
# LD_LIBRARY_PATH set to the unpacked library directories, and DIR/packages.txt.
set -euo pipefail
DIR=$1
ROOT=$DIR/root DEBS=$DIR/debs
log() { echo "[$(date +%T)] $*"; }
mkdir -p "$ROOT" "$DEBS" "$DIR/bin"
declare -A owner=() unpacked=() present=()
while read -r name status; do
  [ "$status" = installed ] && present[${name%%:*}]=1
done < <(dpkg-query -W -f='${Package} ${db:Status-Status}\n')

installed() { [ -n "${present[$1]:-}" ]; }

# Download and unpack package $1; remember which package each unpacked file came from.
fetch() {
  local pkg=$1 deb
  (cd "$DEBS" && apt-get download "$pkg" >/dev/null 2>&1) || { log "cannot download $pkg"; return 1; }
  deb=$(ls "$DEBS"/"${pkg}"_*.deb | head -1)
  dpkg-deb -x "$deb" "$ROOT"
  while read -r path; do owner[$ROOT/${path#./}]=$pkg; done \
    < <(dpkg-deb --fsys-tarfile "$deb" | tar -t | grep -E '\.so|/chromium$')
  unpacked[$pkg]=1
  echo "$pkg $(dpkg-deb -f "$deb" Version)" >> "$DIR/packages.txt"
  log "unpacked $pkg"
}

# The not-installed, not-yet-unpacked dependencies (every alternative) of packages $@, in order.
candidates() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
      --no-enhances "$@" 2>/dev/null | sed -n 's/^ *|\{0,1\}Depends: //p' | grep -v '^<' \
    | awk '!seen[$0]++' | while read -r dep; do
        installed "$dep" || [ -n "${unpacked[$dep]:-}" ] || echo "$dep"
      done
}

# Debian's library package name for a soname: libFOO.so.N -> libfooN, or libfoo-N after a digit.
policy_name() {
  local base=${1%%.so.*} major=${1##*.so.}
  base=$(echo "$base" | tr 'A-Z_' 'a-z-')
  case $base in *[0-9]) echo "$base-$major" ;; *) echo "$base$major" ;; esac
}

libdirs() {
  find "$ROOT" -name '*.so*' \( -type f -o -type l \) -printf '%h\n' | sort -u | paste -sd:
}

# "FILE SONAME" for every soname ldd cannot find.
missing() {
  local f
  export LD_LIBRARY_PATH
  LD_LIBRARY_PATH=$(libdirs)
  while read -r f; do
    ldd "$f" 2>/dev/null | awk -v f="$f" '/not found/ {print f, $1}'
  done < <(find "$ROOT" -type f \( -name '*.so*' -o -path '*/usr/lib/chromium/chromium' \))
}

log "chromium and chromium-common"
fetch chromium
fetch chromium-common
for round in $(seq 1 10); do
  mapfile -t lacking < <(missing | sort -u -k2,2)
  [ ${#lacking[@]} -gt 0 ] || break
  log "round $round: ${#lacking[@]} sonames missing"
  # ldd also lists what a file's libraries need: every unpacked package's dependencies count.
  mapfile -t all < <(candidates "${!unpacked[@]}")
  for entry in "${lacking[@]}"; do
    file=${entry% *} soname=${entry#* }
    pkg=${owner[$file]:-chromium}
    # The needing package's own dependencies first.
    mapfile -t cands < <(candidates "$pkg"; printf '%s\n' "${all[@]}")
    want=$(policy_name "$soname") found=
    for c in "$want" "${cands[@]}"; do
      [ -n "${unpacked[$c]:-}" ] && { found=$c; break; }
      if [ "$c" = "$want" ]; then
        printf '%s\n' "${cands[@]}" | grep -qx "$want" || continue
        fetch "$c" && { found=$c; break; }
        continue
      fi
      (cd "$DEBS" && apt-get download "$c" >/dev/null 2>&1) || continue
      if dpkg-deb -c "$(ls "$DEBS"/"${c}"_*.deb | head -1)" | grep -q "/$soname\( \|$\)"; then
        rm -f "$DEBS"/"${c}"_*.deb; fetch "$c" && { found=$c; break; }
      fi
      rm -f "$DEBS"/"${c}"_*.deb
    done
    [ -n "$found" ] || { echo "no package provides $soname (needed by $file)" >&2; exit 1; }
  done
done
[ -z "$(missing)" ] || { echo "still missing after 10 rounds:" >&2; missing >&2; exit 1; }

cat > "$DIR/bin/chromium" <<SH
#!/usr/bin/env bash
# Debian's Chromium unpacked by scripts/setup chromium, with the libraries unpacked beside it.
export LD_LIBRARY_PATH="$(libdirs)\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$ROOT/usr/lib/chromium/chromium" "\$@"
SH
chmod +x "$DIR/bin/chromium"
rm -rf "$DEBS"
"$DIR/bin/chromium" --headless --no-sandbox --disable-gpu --version
