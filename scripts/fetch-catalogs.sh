#!/usr/bin/env bash
# Fetch gettext message catalogues (.mo) for the real-data corpus on a machine that has none.
#
#   scripts/fetch-catalogs.sh DIR [LANG ...]
#
# Downloads the .deb files of a fixed list of Debian packages with `apt-get download` (no
# installation, no root needed beyond what apt-get download needs) and unpacks only their
# `usr/share/locale/` trees with `dpkg-deb -x` into DIR, laid out as
# DIR/<lang>/LC_MESSAGES/*.mo — the layout the corpus builder reads:
#
#   cargo run --release --example corpus -- --catalogs DIR --lang de
#
# With LANG arguments only those languages are kept (e.g. `de fr ko`); without, all. The
# package list is the one that provides the catalogues of the development machine (Debian 12
# "bookworm"; see docs/translate.md, "Data"). Packages that apt cannot find (other releases
# rename some: postgresql-15, libapt-pkg6.0, ...) are reported and skipped; DIR/PACKAGES.txt
# records the package versions that were unpacked, since the corpus (and its SHA-256) depends
# on them. Needs apt-get and dpkg-deb (Debian, Ubuntu) and package lists (`apt-get update`).
# CATALOG_PACKAGES="sed grep" overrides the package list (e.g. to try the script quickly).
set -euo pipefail

if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
out=$1
shift
langs=("$@")

for tool in apt-get dpkg-deb; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found (Debian or Ubuntu needed)" >&2; exit 1; }
done

packages=(
    adduser apt appstream at-spi2-common bash binutils-common coreutils diffutils dpkg findutils
    gettext gettext-base git gnupg-l10n grep gsettings-desktop-schemas krb5-locales
    libapt-pkg6.0 libavahi-common-data libc-l10n libdpkg-perl libelf1 libgdk-pixbuf2.0-common
    libglib2.0-data libgnutls30 libgstreamer1.0-0 libgtk2.0-common libidn2-0 libpam-runtime
    libpq5 login m4 make man-db net-tools packagekit polkitd postgresql-15
    postgresql-client-15 procps psmisc python-apt-common sed shared-mime-info
    software-properties-common systemd tar wget xdg-user-dirs xkb-data xz-utils
)
if [[ -n "${CATALOG_PACKAGES:-}" ]]; then
    read -r -a packages <<< "$CATALOG_PACKAGES"
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

missing=()
: > "$out/PACKAGES.txt"
for pkg in "${packages[@]}"; do
    mkdir -p "$work/deb"
    if ! (cd "$work/deb" && apt-get download -q "$pkg" >/dev/null 2>"$work/err"); then
        echo "skipped $pkg: $(grep -m1 -E '^E:' "$work/err" || tail -n1 "$work/err")" >&2
        missing+=("$pkg")
        rm -rf "$work/deb"
        continue
    fi
    deb=$(ls "$work/deb"/*.deb)
    version=$(dpkg-deb -f "$deb" Version)
    dpkg-deb -x "$deb" "$work/root"
    if [[ -d "$work/root/usr/share/locale" ]]; then
        (
            cd "$work/root/usr/share/locale"
            for dir in */LC_MESSAGES; do
                lang=${dir%/LC_MESSAGES}
                if [[ ${#langs[@]} -gt 0 && ! " ${langs[*]} " == *" $lang "* ]]; then
                    continue
                fi
                shopt -s nullglob
                files=("$dir"/*.mo)
                shopt -u nullglob
                [[ ${#files[@]} -eq 0 ]] && continue
                mkdir -p "$out/$dir"
                cp "${files[@]}" "$out/$dir/"
            done
        )
    fi
    echo "$pkg $version" >> "$out/PACKAGES.txt"
    echo "unpacked $pkg $version" >&2
    rm -rf "$work/deb" "$work/root"
done

count=$(find "$out" -name '*.mo' | wc -l)
echo "$count catalogues in $out ($(wc -l < "$out/PACKAGES.txt") packages; versions in $out/PACKAGES.txt)"
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "not found by apt: ${missing[*]}"
fi
[[ $count -gt 0 ]]
