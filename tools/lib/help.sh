# SPDX-License-Identifier: GPL-2.0
# Sourced by the scripts a person runs: `--help` or `-h` as the first
# argument prints the script's leading comment (its manual) and exits 0.
help_text() {
	awk 'NR == 1 && /^#!/ { next }
		/^# SPDX/ { next }
		/^#/ { sub(/^# ?/, ""); if (started || $0 != "") print; started = 1; next }
		{ exit }' "$1"
}
case "${1:-}" in
-h | --help)
	help_text "$0"
	exit 0
	;;
esac
