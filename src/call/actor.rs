//! `CallActor`: one per in-flight call. It runs [`super::run`] and answers through a
//! oneshot, then stops. The actor exists so that every call is a supervised unit in the
//! harness's tree; it waits only on its own call.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::Value;
use tokio::sync::oneshot;

use super::{CallKind, Caller};
use crate::harness::HarnessError;
use crate::harness::core::Core;

/// What a call actor runs.
pub struct CallArgs {
    pub(crate) core: Arc<Core>,
    pub(crate) caller: Caller,
    pub(crate) kind: CallKind,
    pub(crate) name: String,
    pub(crate) args: Value,
    pub(crate) reply: oneshot::Sender<Result<Value, HarnessError>>,
}

/// One call; see the module docs.
pub struct CallActor;

impl Actor for CallActor {
    type Msg = ();
    type State = Option<CallArgs>;
    type Arguments = CallArgs;

    async fn pre_start(
        &self,
        _: ActorRef<()>,
        args: CallArgs,
    ) -> Result<Option<CallArgs>, ActorProcessingErr> {
        Ok(Some(args))
    }

    async fn post_start(
        &self,
        myself: ActorRef<()>,
        state: &mut Option<CallArgs>,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(a) = state.take() {
            let outcome = super::run(a.core, a.caller, a.kind, a.name, a.args).await;
            let _ = a.reply.send(outcome);
        }
        myself.stop(None);
        Ok(())
    }
}
