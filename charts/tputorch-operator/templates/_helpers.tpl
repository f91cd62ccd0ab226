{{/* Chart name, overridable. */}}
{{- define "tputorch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource name: <release>-<chart> unless the release name already holds the chart name. */}}
{{- define "tputorch.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "tputorch.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the operator pod (never change after install: Deployment selectors are immutable). */}}
{{- define "tputorch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tputorch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object of the release. */}}
{{- define "tputorch.labels" -}}
{{ include "tputorch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: tputorch
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "tputorch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tputorch.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository@digest when a digest is set, else repository:tag (tag defaults to appVersion). */}}
{{- define "tputorch.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
RBAC rules for the namespaced objects the operator touches, used by the ClusterRole (every
namespace) or by one Role per watched namespace. Nothing else: no Secrets, no pod create.
*/}}
{{- define "tputorch.namespacedRules" -}}
# The operator's kinds: read (list + watch) and their status written through the subresource.
- apiGroups: ["tputorch.io"]
  resources: ["tputorchjobs", "tputorchservices"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["tputorch.io"]
  resources: ["tputorchjobs/status", "tputorchservices/status"]
  verbs: ["get", "patch"]
# Children carry an ownerReference with blockOwnerDeletion: where the
# OwnerReferencesPermissionEnforcement admission plugin is on, that needs update on the owner's
# finalizers subresource.
- apiGroups: ["tputorch.io"]
  resources: ["tputorchjobs/finalizers", "tputorchservices/finalizers"]
  verbs: ["update"]
# One RayJob per TPUTorchJob and one RayService per TPUTorchService; patch keeps what may change
# in sync (a job's suspend, a service's spec); a job's RayJob is deleted when its attempt ends (a
# new attempt is a new RayJob on a fresh slice).
- apiGroups: ["ray.io"]
  resources: ["rayjobs", "rayservices"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Kueue's Workload of a queued child: read for the Queued/Admitted/Preempted status; patched only
# in spec.active, which carries the user's spec.suspend to Kueue (Kueue owns the child's suspend).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["delete"]
# A service's running RayCluster gets the worker bounds of spec.replicas (KubeRay's cluster hash
# leaves them out, so a RayService edit never reaches it); only one the RayService controls.
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["get", "patch"]
# Pods of the slice (labelled by KubeRay) are watched for readiness; never created.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
{{- if .Values.networkPolicy.enabled }}
# One NetworkPolicy per Ray cluster (its own pods, KubeRay, the operator; a service's Serve port).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch"]
{{- end }}
# A job's Ray auth token goes into a Secret the operator creates (KubeRay hands it to the Ray
# pods); the token is derived from the operator's own key, so it never reads a Secret back.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# Events on the operator's objects: its own (events.k8s.io/v1) and kopf's warnings (core/v1).
- apiGroups: ["events.k8s.io", ""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}

{{/*
What the operator reads cluster-wide in every mode. Kueue's Workload CRD, by name (its list and
watch select it by metadata.name): its schema's cap on pod sets per Workload bounds a queued job's
groups. Its own two CRDs, by name, once at startup: whether they are this release's (Helm never
upgrades crds/; controller/crdcheck.py). No other CRD, and no namespace list: kopf's scanning is
off (controller/handlers.py).
*/}}
{{- define "tputorch.clusterReadRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  resourceNames: ["workloads.kueue.x-k8s.io"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  resourceNames: ["tputorchjobs.tputorch.io", "tputorchservices.tputorch.io"]
  verbs: ["get"]
# Kueue's WorkloadPriorityClasses (cluster-scoped): a spec.priorityClassName that names none is
# reported on the object.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloadpriorityclasses"]
  verbs: ["get", "list", "watch"]
{{- end -}}


{{/*
The operator's pod labels as KEY=VALUE,... for --network-policy-peer.
*/}}
{{- define "tputorch.peerLabels" -}}
{{- $pairs := list -}}
{{- range $k, $v := (include "tputorch.selectorLabels" . | fromYaml) -}}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/*
KubeRay's pod labels (networkPolicy.kuberay.podLabels) as KEY=VALUE,... for --network-policy-peer.
*/}}
{{- define "tputorch.kuberayLabels" -}}
{{- $pairs := list -}}
{{- range $k, $v := .Values.networkPolicy.kuberay.podLabels -}}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/*
A peer ({namespace, podLabels} or {cidr}) as --network-policy-metrics-peer takes it.
*/}}
{{- define "tputorch.peerArg" -}}
{{- if .cidr -}}
{{- .cidr -}}
{{- else -}}
{{- $pairs := list -}}
{{- range $k, $v := .podLabels -}}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- .namespace -}}{{- if $pairs -}}:{{- join "," $pairs -}}{{- end -}}
{{- end -}}
{{- end -}}
