//! The seeded simulation (issue 25); for now only its generated world.

mod world;
