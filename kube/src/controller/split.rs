//! A split cache, on the controller's side: the main watcher is built when
//! first polled, so that a split cache can still narrow it to this
//! replica's share, and the replica's candidacy for the group's
//! coordinator starts with its membership.

use std::fmt::Debug;
use std::sync::{Arc, OnceLock};

use futures_util::future::Either;
use futures_util::{Stream, StreamExt, stream};
use kube_client::{Api, Resource};
use kube_runtime::watcher::{self, Event, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::error::ControllerError;
use crate::shard::{Coordinating, Coordinator, Kind, Shards, View, selector};

/// The main watcher of a controller made by
/// [`Controller::new`](super::Controller::new): its API, and the selector
/// of this replica's share once a split cache set it.
pub(crate) struct MainWatch<K> {
    api: Api<K>,
    /// As the user gave it: the coordinator labels what it selects.
    wc: watcher::Config,
    own: Arc<OnceLock<String>>,
}

impl<K> MainWatch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    /// The watch of `api` with `wc`, and its events, which start (with
    /// `wc`'s label selector narrowed to this replica's share, if one was
    /// set by then) when first polled.
    pub(crate) fn new(
        api: Api<K>,
        wc: watcher::Config,
    ) -> (
        Self,
        impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    ) {
        let own = Arc::new(OnceLock::<String>::new());
        let events = {
            let (api, own, wc) = (api.clone(), own.clone(), wc.clone());
            stream::once(async move {
                match own.get() {
                    None => Either::Left(watcher(api, wc)),
                    Some(own) => Either::Right(share_watch(api, share_config(&wc, own))),
                }
            })
            .flatten()
        };
        (MainWatch { api, wc, own }, events)
    }
}

/// `wc` narrowed to this replica's share: its label selector with `own`
/// (the [`selector`] of its member) added.
pub(crate) fn share_config(wc: &watcher::Config, own: &str) -> watcher::Config {
    let mut wc = wc.clone();
    wc.label_selector = Some(crate::shard::narrow(wc.label_selector.as_deref(), own));
    wc
}

/// The watch of a split cache (a controller's own or a manager's) with
/// `wc`, a [`share_config`].
pub(crate) fn share_watch<K>(
    api: Api<K>,
    wc: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    // A split cache does not keep the record of the label writes (see
    // `shard::LABEL_MANAGER`).
    watcher(api, wc).map(|event| event.map(|e| e.modify(crate::shard::forget_label_manager)))
}

/// Starts a replica's candidacy for coordinator with the membership's view.
pub(crate) type StartCoordinator =
    Box<dyn FnOnce(watch::Receiver<Arc<View>>) -> Coordinating + Send>;

/// For a controller whose shards split the cache: narrows its main watcher
/// to this replica's share and gives the candidacy to start with the
/// membership. `None` without a split cache. A config that does not
/// validate is reported by the membership's own check, and the controller
/// then polls neither its watcher nor the candidacy.
///
/// # Errors
///
/// A split cache on a controller that was not made by `Controller::new`
/// (its watcher is someone else's, so it cannot be narrowed).
pub(crate) fn narrow<K>(
    shards: Option<&Shards>,
    main: Option<&MainWatch<K>>,
    dyntype: &K::DynamicType,
) -> Result<Option<StartCoordinator>, ControllerError>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
{
    let Some(shards) = shards.filter(|s| s.config().splits_cache().is_some()) else {
        return Ok(None);
    };
    let Some(main) = main else {
        return Err(ControllerError::SplitCacheWithoutWatcher);
    };
    let config = shards.config();
    // Set once: a controller is run once.
    let _ = main.own.set(selector(config));
    let coordinator = Coordinator::new(
        main.api.clone().into_client(),
        vec![Kind::new(
            main.api.clone(),
            main.wc.clone(),
            dyntype.clone(),
        )],
        config.clone(),
        shards.clock(),
        shards.label_patch_counter(),
    );
    Ok(Some(Box::new(move |view| coordinator.start(view))))
}
