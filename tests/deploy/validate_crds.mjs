// Validate custom resources with the @kubernetes-models packages (each class checks the CRD's
// own JSON schema in validate()). Reads a JSON array of objects on stdin; writes a JSON array of
// {kind, name, error} (error null when valid). tests/deploy/tools.py copies this file next to
// the node_modules it imports from.
import { ScaledObject, TriggerAuthentication } from "@kubernetes-models/keda/keda.sh/v1alpha1";
import { PodMonitor, ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const CLASSES = {
  "keda.sh/v1alpha1/ScaledObject": ScaledObject,
  "keda.sh/v1alpha1/TriggerAuthentication": TriggerAuthentication,
  "monitoring.coreos.com/v1/ServiceMonitor": ServiceMonitor,
  "monitoring.coreos.com/v1/PodMonitor": PodMonitor,
};

let input = "";
for await (const chunk of process.stdin) input += chunk;

const results = JSON.parse(input).map((obj) => {
  const key = `${obj.apiVersion}/${obj.kind}`;
  const Model = CLASSES[key];
  let error = null;
  if (Model === undefined) {
    error = `no validator for ${key}`;
  } else {
    try {
      new Model(obj).validate();
    } catch (e) {
      error = e.message;
    }
  }
  return { kind: obj.kind, name: obj.metadata?.name ?? null, error };
});
process.stdout.write(JSON.stringify(results));
