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
