//! Rebuilds when a migration is added: `sqlx::migrate!` embeds the migrations folders, and
//! cargo does not otherwise notice a new file in them.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
