#!/usr/bin/env bash
# Regenerates the .mo fixtures of research/tests/mo.rs with GNU msgfmt (gettext-tools 0.21).
# The .mo files are committed, so the tests need neither msgfmt nor system catalogues.
set -euo pipefail
cd "$(dirname "$0")"
msgfmt --endianness=little -o de.le.mo de.po   # minor revision 1 (system-dependent strings)
msgfmt --endianness=big -o de.be.mo de.po
msgfmt --no-hash -o ko.euc-kr.mo ko.po         # revision 0, EUC-KR
