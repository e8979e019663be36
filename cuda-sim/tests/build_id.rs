//! `testing::driver()` refuses a simulator library built from other sources than the tests.

use cuda_sim::testing::{CHILD_ENV, LIBRARY_ENV, LIBRARY_NAME, in_simulated_machine, library_path, on_simulator};

/// A copy of `library` whose build id is another one (each hex digit of `id` moved on by one).
fn with_other_build_id(library: &[u8], id: &str) -> Vec<u8> {
    let other: String = id
        .chars()
        .map(|c| if c == 'f' { '0' } else { char::from_digit(c.to_digit(16).unwrap() + 1, 16).unwrap() })
        .collect();
    let mut patched = library.to_vec();
    let mut replaced = 0;
    let mut at = 0;
    while let Some(found) = patched[at..].windows(id.len()).position(|w| w == id.as_bytes()) {
        patched[at + found..at + found + id.len()].copy_from_slice(other.as_bytes());
        at += found + id.len();
        replaced += 1;
    }
    assert!(replaced > 0, "the build id {id} is not in the library");
    patched
}

#[test]
fn a_library_built_from_other_sources_is_refused() {
    const NAME: &str = "a_library_built_from_other_sources_is_refused";
    let dir = std::env::temp_dir().join(format!("cuda-sim-build-id-{}", std::process::id()));
    let stale = dir.join(LIBRARY_NAME);
    if on_simulator() && std::env::var_os(CHILD_ENV).is_none() {
        let library = library_path().expect("the simulator library");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&stale, with_other_build_id(&std::fs::read(library).unwrap(), cuda_sim::BUILD_ID)).unwrap();
    }
    let stale_path = stale.to_string_lossy().into_owned();
    in_simulated_machine(NAME, &[(LIBRARY_ENV, &stale_path)], || {
        if !on_simulator() {
            return;
        }
        let error = cuda_sim::testing::driver().expect_err("a simulator of another build is refused");
        assert!(
            matches!(&error, cuda_mem_sys::LoadError::BuildMismatch { expected, found: Some(_), .. } if *expected == cuda_sim::BUILD_ID),
            "{error:?}"
        );
        let error = error.to_string();
        assert!(error.contains("stale build") && error.contains(cuda_sim::BUILD_ID), "{error}");
    });
    let _ = std::fs::remove_dir_all(&dir);
}
