//! `testing::in_simulated_machine`: the name it is given must be the calling test's own, or it
//! fails loudly (a wrong name would re-run another test in the child, and this body never).

use cuda_sim::testing::{CHILD_ENV, in_simulated_machine};

#[test]
fn the_body_runs_in_a_child_with_its_environment() {
    in_simulated_machine("the_body_runs_in_a_child_with_its_environment", &[("CUDA_SIM_DEVICES", "3")], || {
        assert!(std::env::var(CHILD_ENV).is_ok(), "the body runs in the child");
        assert_eq!(std::env::var("CUDA_SIM_DEVICES").as_deref(), Ok("3"));
    });
}

#[test]
#[should_panic(expected = "in_simulated_machine was given the name \"the_body_runs_in_a_child_with_its_environment\"")]
fn a_name_that_is_not_the_tests_own_fails_loudly() {
    // The name of another test of this binary: before the check, the child ran that test (which
    // passed), and this body never ran.
    in_simulated_machine("the_body_runs_in_a_child_with_its_environment", &[], || {
        panic!("this body must not be reached through another test's name");
    });
}

#[test]
#[should_panic(expected = "but the test running is \"a_misspelled_name_fails_loudly\"")]
fn a_misspelled_name_fails_loudly() {
    in_simulated_machine("a_mispelled_name_fails_loudly", &[], || {});
}

/// Set (to the simulator's path) in the child of the test below.
const NAMED_ENV: &str = "CUDA_SIM_TEST_NAMED_DRIVER";

/// A GPU bundle run against its own simulator names it in `CUDA_MEM_DRIVER`: the tests must still
/// know they are on the simulator (each in a simulated machine of its own, the simulator's model
/// checked) and link `libcuda.so` to that very library, so that cudarc shares its machine.
#[test]
fn a_simulator_named_by_cuda_mem_driver_is_the_simulator() {
    let library = std::fs::canonicalize(cuda_sim::testing::library_path().expect("the simulator is built")).unwrap();
    // A copy elsewhere, so that finding the one beside the test binary instead would show.
    let elsewhere = tempfile::tempdir().unwrap();
    let named = elsewhere.path().join("libcuda_sim.so");
    std::fs::copy(&library, &named).unwrap();
    let named = named.as_os_str();
    run_child(
        "the_named_simulator_seen_from_inside",
        &[(cuda_mem_sys::DRIVER_ENV, named), (NAMED_ENV, named)],
        "checked the named simulator",
    );
}

/// Runs the test `name` of this binary alone in a child process, with `env` set and
/// `CUDA_SIM_LIB` unset, and asserts that it passed having printed `done` (so that it ran in
/// earnest, not as the trivial pass it is without its variable).
fn run_child(name: &str, env: &[(&str, &std::ffi::OsStr)], done: &str) {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .env_remove(cuda_sim::testing::LIBRARY_ENV)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed") && stdout.contains(done),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The child of the test above (passes trivially anywhere else).
#[test]
fn the_named_simulator_seen_from_inside() {
    let Some(named) = std::env::var_os(NAMED_ENV) else { return };
    let named = std::path::PathBuf::from(named);
    assert!(cuda_sim::testing::on_simulator(), "CUDA_MEM_DRIVER names the simulator");
    assert_eq!(cuda_sim::testing::library_path().as_deref(), Some(named.as_path()));
    let links = cuda_sim::testing::libcuda_dir().unwrap();
    for name in ["libcuda.so", "libcuda.so.1"] {
        assert_eq!(std::fs::canonicalize(links.join(name)).unwrap(), named, "{name}");
    }
    let driver = cuda_sim::testing::driver().unwrap();
    assert_eq!(driver.path(), named.as_path(), "the library loaded is the one named");
    assert!(driver.library_symbol(c"cuSimBuildId").is_ok(), "and it is the simulator");
    // Each body in a machine of its own, as without CUDA_MEM_DRIVER.
    in_simulated_machine("the_named_simulator_seen_from_inside", &[], || {
        assert!(std::env::var(CHILD_ENV).is_ok(), "the body runs in a child");
    });
    println!("checked the named simulator");
}

/// Set in the child of the test below.
const HIDDEN_ENV: &str = "CUDA_SIM_TEST_HIDDEN_CONTROLS";

/// A rehearsal of a GPU run: the simulator named by `CUDA_MEM_DRIVER` with its controls hidden
/// passes for a real driver, and the helpers take a real driver's paths.
#[test]
fn a_simulator_with_hidden_controls_passes_for_a_real_driver() {
    let library = cuda_sim::testing::library_path().expect("the simulator is built");
    let one = std::ffi::OsStr::new("1");
    run_child(
        "the_hidden_controls_seen_from_inside",
        &[
            (cuda_mem_sys::DRIVER_ENV, library.as_os_str()),
            (cuda_sim::testing::HIDE_CONTROLS_ENV, one),
            (HIDDEN_ENV, one),
        ],
        "checked the hidden controls",
    );
}

/// The child of the test above (passes trivially anywhere else).
#[test]
fn the_hidden_controls_seen_from_inside() {
    if std::env::var_os(HIDDEN_ENV).is_none() {
        return;
    }
    let driver = cuda_sim::testing::driver().unwrap();
    assert!(!cuda_sim::testing::is_simulator(driver) && !cuda_sim::testing::on_simulator());
    let refused = cuda_sim::testing::live_objects(driver).unwrap_err();
    assert_eq!(refused.code(), Some(cuda_mem_sys::types::CUresult::CUDA_ERROR_NOT_FOUND), "{refused}");
    assert!(cuda_sim::testing::count_calls(driver, || ()).is_err());
    assert_eq!(cuda_sim::testing::live_objects_if_simulated(), None);
    let ((), counted) = cuda_sim::testing::count_calls_if_simulated(|| ());
    assert_eq!(counted.counts(), None, "nothing counted");
    counted.assert_total(7, "holds where nothing was counted");
    // The driver functions work as ever.
    // SAFETY: cuInit takes no pointers; flags must be 0.
    unsafe { cuda_mem_sys::cu_call!(driver, cuInit(0)) }.unwrap();
    println!("checked the hidden controls");
}
