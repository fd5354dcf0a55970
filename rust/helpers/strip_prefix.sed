# SPDX-License-Identifier: GPL-2.0
# The kernel's rust/Makefile does this to bindings_helpers_generated.rs.
s/pub fn rust_helper_([a-zA-Z0-9_]*)/#[link_name="rust_helper_\1"]\n    pub fn \1/g
