#!/usr/bin/env bash
# Rebuild an English→LANG demo corpus from the LANG gettext catalogs of pinned Debian 12 (bookworm)
# packages: LANG=de (the default) writes data/demo/, LANG=fr writes data/demo_fr/. Deterministic: the
# same packages give the same bytes.
#
#   bash scripts/build_demo_corpus.sh [LANG]        e.g. bash scripts/build_demo_corpus.sh fr
#
# Needs only bash, apt-get, dpkg-deb (with the tar it pipes into) and python3 (standard library). Settings (environment):
#   DEMO_OUT       output directory                   (default data/demo for de, data/demo_LANG otherwise)
#   DEMO_PACKAGES  pinned "name version" list         (default $DEMO_OUT/packages.txt)
#   DEMO_WORK      work dir for downloads/extraction  (default work/demo_corpus)
#   DEMO_DEBS      where the .deb files are kept      (default $DEMO_WORK/debs; reused if present, by every LANG)
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "build_demo_corpus: error: $*" >&2; exit 1; }

[ $# -le 1 ] || die "one argument at most, the target language: bash scripts/build_demo_corpus.sh fr"
CORPUS_LANG=${1:-de}
[[ $CORPUS_LANG =~ ^[a-z]{2}$ ]] || die "'$CORPUS_LANG' is not a two-letter language code: bash scripts/build_demo_corpus.sh fr"
if [ "$CORPUS_LANG" = de ]; then OUT=${DEMO_OUT:-data/demo}; else OUT=${DEMO_OUT:-data/demo_$CORPUS_LANG}; fi
PACKAGES=${DEMO_PACKAGES:-$OUT/packages.txt}
WORK=${DEMO_WORK:-work/demo_corpus}
DEBS=${DEMO_DEBS:-$WORK/debs}
EXTRACT=$WORK/extract/$CORPUS_LANG
# The language's catalogs only: de and de_DE (fr and fr_FR), never the regional variants (de_AT, fr_CA…).
CATALOG_RE="^\./usr/share/locale/$CORPUS_LANG(_${CORPUS_LANG^^})?/LC_MESSAGES/[^/]+\.mo\$"

# Print the path of the .deb for package $1 at version $2 in $DEBS, downloading it if needed.
fetch_deb() {
    local name=$1 version=$2 deb
    deb=$(find_deb "$name" "$version")
    if [ -z "$deb" ]; then
        if ! (cd "$DEBS" && apt-get download -q "$name=$version" </dev/null >&2); then
            die "cannot download $name=$version: that pinned version is not in the apt sources
  (run 'apt-get update' first; if it still fails, the version has left the archive).
  Fetch ${name} version ${version} from https://snapshot.debian.org/binary/$name/ ,
  put the .deb into $DEBS and run this script again."
        fi
        deb=$(find_deb "$name" "$version")
    fi
    [ -n "$deb" ] || die "$name=$version was downloaded but no matching .deb is in $DEBS"
    echo "$deb"
}

# Print the .deb in $DEBS whose control fields say package $1, version $2 (empty if none).
find_deb() {
    local name=$1 version=$2 deb
    for deb in "$DEBS/${name}_"*.deb; do
        [ -f "$deb" ] || continue
        if [ "$(dpkg-deb -f "$deb" Package)" = "$name" ] && [ "$(dpkg-deb -f "$deb" Version)" = "$version" ]; then
            echo "$deb"
            return
        fi
    done
}

# Extract the $CORPUS_LANG .mo catalogs of .deb $1 into directory $2 (via one temporary tar file).
extract_catalogs() {
    local deb=$1 dest=$2 tarball=$WORK/fsys.tar member members=()
    dpkg-deb --fsys-tarfile "$deb" > "$tarball"
    while read -r member; do
        if [[ $member =~ $CATALOG_RE ]]; then members+=("$member"); fi
    done < <(tar -tf "$tarball")
    [ ${#members[@]} -gt 0 ] || die "${deb##*/} ships no $CORPUS_LANG catalog (usr/share/locale/$CORPUS_LANG/LC_MESSAGES/*.mo);
  take it out of $PACKAGES"
    mkdir -p "$dest"
    tar -xf "$tarball" -C "$dest" "${members[@]}"
    rm -f "$tarball"
}

[ -f "$PACKAGES" ] || die "package list $PACKAGES not found"
mkdir -p "$DEBS"
rm -rf "$EXTRACT"
mkdir -p "$EXTRACT"
while read -r name version _; do
    case "$name" in ''|'#'*) continue ;; esac
    deb=$(fetch_deb "$name" "$version")
    extract_catalogs "$deb" "$EXTRACT/$name"
done < "$PACKAGES"

python3 scripts/demo_corpus.py --lang "$CORPUS_LANG" --packages "$PACKAGES" --extract-dir "$EXTRACT" --out "$OUT"
