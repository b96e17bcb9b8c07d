//! Each method's tests, one folder per method (as `src/methods/`).

mod characterbench;
mod roleeval;
mod rolemrc;
mod sharp;
