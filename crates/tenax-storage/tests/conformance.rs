//! The storage conformance suite, once per backend.
tenax_storage::conformance_tests!(sqlite, tenax_storage::testing::sqlite_file);
