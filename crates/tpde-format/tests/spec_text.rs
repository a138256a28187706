//! The spec's own statements of which version it is agree with the format crate's: a new minor
//! version that forgets one of them fails here.

use tpde_format::header::FORMAT_MINOR;

fn spec() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../spec/tpde-v1.md")).unwrap()
}

#[test]
fn the_spec_states_the_current_minor_version_everywhere() {
    let spec = spec();
    let current = format!("1.{FORMAT_MINOR}");
    assert!(spec.starts_with(&format!("# TPDE container format, version {current}\n")), "the title");
    for stated in
        [format!("this document defines 0 to {FORMAT_MINOR} |"), format!("No other bit is defined (up to {current});")]
    {
        assert!(spec.contains(&stated), "spec/tpde-v1.md should say {stated:?}");
    }
}
