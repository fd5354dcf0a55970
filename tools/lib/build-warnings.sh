#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# tools/lib/build-warnings.sh LOG
#
# The "no warnings" gate of tools/check.sh over a Kbuild log of the module
# and the samples (make ... CLIPPY=1 modules).  Prints every warning or
# error line of LOG with its line number and exits 1 if there is one, 0 if
# there is none, 2 on a usage error.  What counts:
#
#   rustc and clippy   "warning: ..." / "error[E...]: ..." at the start of a
#                      line
#   C compiler         "FILE:LINE[:COL]: warning|error|fatal error: ..."
#                      (clang, gcc, the assembler)
#   objtool            "FILE.o: warning|error: objtool: ..."
#   modpost            "WARNING: modpost: ..." / "ERROR: modpost: ..."
#   driver and linker  "clang[-19]: warning: ...", "ld.lld: warning: ..."
#
# make's own messages ("make[1]: warning: ...", about the build system, not
# the code) are not counted.
set -euo pipefail
# shellcheck source=tools/lib/help.sh
. "$(dirname "$0")/help.sh"

if [ $# -ne 1 ] || [ ! -r "$1" ]; then
	echo "usage: tools/lib/build-warnings.sh LOG (a readable Kbuild log)" >&2
	exit 2
fi

patterns=(
	# rustc and clippy (Kbuild prints them as rustc does).
	'^(warning|error)'
	# A compiler's diagnostic with a location.
	'^[^ ]+:[0-9]+(:[0-9]+)?: (warning|error|fatal error): '
	# objtool names the object: "x.o: warning: objtool: fn+0x1: ...".
	'^[^ ]+: (warning|error): objtool'
	# modpost.
	'^(WARNING|ERROR): '
	# The compiler driver and the linker without a location.
	'^(clang|gcc|cc|ld|ld\.lld|ld\.bfd|llvm-[a-z]+)(-[0-9]+)?: (warning|error): '
)
regex=$(printf '%s|' "${patterns[@]}")
regex=${regex%|}
if grep -nE "$regex" "$1"; then
	exit 1
fi
exit 0
