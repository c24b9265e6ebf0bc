//! Elementwise and attention ops (lead).
