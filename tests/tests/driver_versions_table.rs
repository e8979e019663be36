//! The README's driver-version table is `cuda-mem-core`'s (`cuda-mem-core/src/driver_versions.md`,
//! which the crate documentation includes), row for row.

#[test]
fn the_readme_carries_the_crate_documentations_table() {
    let readme = include_str!("../../README.md");
    let source = include_str!("../../cuda-mem-core/src/driver_versions.md");
    let table: Vec<&str> = source.lines().filter(|line| line.starts_with('|')).collect();
    assert!(table.len() > 10, "the table has its rows");
    let start = readme.lines().position(|line| line == table[0]).expect("README.md has the driver table");
    let in_readme: Vec<&str> = readme.lines().skip(start).take(table.len()).collect();
    assert_eq!(in_readme, table, "README.md's driver table differs from cuda-mem-core/src/driver_versions.md");
}
