//! Installing CustomResourceDefinitions the way a user does: through the
//! apiextensions API, then waiting until the API server says they are
//! Established.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::api::PostParams;
use kube_client::{Api, Client};
use kube_runtime::wait::{await_condition, conditions};

/// How long a CRD may take to become Established (well under a second on
/// either backend).
const ESTABLISHED_LIMIT: Duration = Duration::from_secs(30);

/// Creates `crd` (or finds it installed already, by an earlier test of the
/// same binary) and waits until it is Established, so its kind can be used
/// at once. Returns the CRD as the server has it.
///
/// # Panics
///
/// If the server refuses the CRD, or it is not Established in time: a test
/// cannot go on without its kind.
pub async fn install_crd(
    client: Client,
    crd: &CustomResourceDefinition,
) -> CustomResourceDefinition {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let name = crd
        .metadata
        .name
        .as_deref()
        .expect("a CustomResourceDefinition has a name");
    match api.create(&PostParams::default(), crd).await {
        Ok(_) => {}
        Err(kube_client::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("creating CustomResourceDefinition {name}: {e}"),
    }
    let established = await_condition(api, name, conditions::is_crd_established());
    match tokio::time::timeout(ESTABLISHED_LIMIT, established).await {
        Ok(Ok(Some(crd))) => crd,
        Ok(Ok(None)) => panic!("CustomResourceDefinition {name} was deleted while waiting"),
        Ok(Err(e)) => panic!("waiting for CustomResourceDefinition {name}: {e}"),
        Err(_) => {
            panic!("CustomResourceDefinition {name} not Established after {ESTABLISHED_LIMIT:?}")
        }
    }
}
