//! P4: not written yet.

use crate::report::{Measure, Spec};
use crate::support::{BoxError, Ctx};

pub(crate) async fn run(_ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    Ok(Vec::new())
}

pub(crate) fn specs() -> Vec<Spec> {
    Vec::new()
}
