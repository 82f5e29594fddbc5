{{/* Labels every object carries, upstream Akri's: `name` is the part (akri-agent,
akri-controller, akri-<handler>-discovery, the webhook's name), `component` its kind, and
`part-of: akri` what upstream's tooling selects on. */}}
{{- define "akri-trio.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: akri
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end }}

{{/* The selector subset of the labels, upstream's own (part-of, instance, name), so a release
of upstream Akri's chart upgrades in place: selectors cannot change on an upgrade. */}}
{{- define "akri-trio.selector" -}}
app.kubernetes.io/part-of: akri
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/name: {{ .name }}
{{- end }}

{{/* image: and imagePullPolicy: of a component, its own `image` keys over the top-level ones. */}}
{{- define "akri-trio.image" -}}
{{- $own := .image | default dict -}}
{{- $top := .root.Values.image -}}
{{- $repository := $own.repository | default $top.repository -}}
{{- $tag := $own.tag | default $top.tag | default .root.Chart.AppVersion -}}
image: {{ printf "%s:%s" $repository $tag | quote }}
{{- with ($own.pullPolicy | default $top.pullPolicy) }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/* Pod-level hardening shared by every Pod of the chart. */}}
{{- define "akri-trio.podSecurityContext" -}}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container hardening for unprivileged components (the image's own user). */}}
{{- define "akri-trio.unprivileged" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{/* Container hardening for components that serve or use root-owned sockets on the host
(the agent: kubelet device plugins; standalone handlers: the agent's registration socket).
Root, but with no capabilities, so it can use what root owns and nothing more. */}}
{{- define "akri-trio.hostRoot" -}}
runAsNonRoot: false
runAsUser: 0
runAsGroup: 0
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{/* Whether a Pod that talks to the API server must use the host's network: asked for, or
needed to reach the kubernetesApiOverride address. */}}
{{- define "akri-trio.apiHostNetwork" -}}
{{- if or .asked .root.Values.kubernetesApiOverride.enabled }}true{{ end -}}
{{- end }}

{{/* Env entries that point the in-cluster config at kubernetesApiOverride (when enabled). */}}
{{- define "akri-trio.apiEnv" -}}
{{- with .Values.kubernetesApiOverride }}
{{- if .enabled }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .port | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* requests/limits from upstream's flat resource keys; an empty value is left out. */}}
{{- define "akri-trio.resources" -}}
requests:
  {{- with .memoryRequest }}
  memory: {{ . }}
  {{- end }}
  {{- with .cpuRequest }}
  cpu: {{ . }}
  {{- end }}
limits:
  {{- with .memoryLimit }}
  memory: {{ . }}
  {{- end }}
  {{- with .cpuLimit }}
  cpu: {{ . }}
  {{- end }}
{{- end }}

{{/* nodeSelector: linux when linuxOnly, the control plane when onlyOnControlPlane, plus the
user's nodeSelectors. */}}
{{- define "akri-trio.nodeSelector" -}}
{{- $sel := dict -}}
{{- if .linuxOnly }}{{ $_ := set $sel "kubernetes.io/os" "linux" }}{{ end -}}
{{- if .onlyOnControlPlane }}{{ $_ := set $sel "node-role.kubernetes.io/control-plane" "" }}{{ end -}}
{{- $sel = merge $sel (.nodeSelectors | default dict) -}}
{{- if $sel }}
nodeSelector:
  {{- toYaml $sel | nindent 2 }}
{{- end }}
{{- end }}

{{/* Tolerations for components allowed on the control plane. */}}
{{- define "akri-trio.controlPlaneTolerations" -}}
{{- if .allowOnControlPlane }}
tolerations:
  - key: node-role.kubernetes.io/control-plane
    operator: Exists
    effect: NoSchedule
{{- end }}
{{- end }}

{{- define "akri-trio.metricsPort" -}}
{{- .own | default .root.Values.prometheus.port -}}
{{- end }}
