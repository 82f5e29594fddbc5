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

{{/* image: and imagePullPolicy: of a component, its own `image` keys over the top-level ones;
as upstream's, `fullRepository` for the full agent (`full`) and the tag `latest` with
useLatestContainers when no tag is given. */}}
{{- define "akri-trio.image" -}}
{{- $own := .image | default dict -}}
{{- $top := .root.Values.image -}}
{{- $repository := $own.repository | default $top.repository -}}
{{- if .full }}{{ $repository = $own.fullRepository | default $repository }}{{ end -}}
{{- $latest := ternary "latest" .root.Chart.AppVersion (.root.Values.useLatestContainers | default false) -}}
{{- $tag := $own.tag | default $top.tag | default $latest -}}
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

{{/* Tolerations: the control plane's for components allowed there, then the user's
`tolerations` (a list; upstream's default is an empty map, which adds none). */}}
{{- define "akri-trio.tolerations" -}}
{{- $all := list -}}
{{- if .allowOnControlPlane }}
{{- $all = append $all (dict "key" "node-role.kubernetes.io/control-plane" "operator" "Exists" "effect" "NoSchedule") -}}
{{- end }}
{{- if kindIs "slice" .tolerations }}{{ $all = concat $all .tolerations }}{{ end -}}
{{- if $all }}
tolerations: {{- toYaml $all | nindent 2 }}
{{- end }}
{{- end }}

{{/* Env entries every component gets: its log level and format (its own `log` over the
top-level one), then its `extraEnv`. */}}
{{- define "akri-trio.commonEnv" -}}
{{- $own := .own.log | default dict -}}
{{- $top := .root.Values.log | default dict -}}
{{- with ($own.level | default $top.level) }}
- name: AKRI_LOG_LEVEL
  value: {{ . | quote }}
{{- end }}
{{- with ($own.format | default $top.format) }}
- name: AKRI_LOG_FORMAT
  value: {{ . | quote }}
{{- end }}
{{- with .own.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "akri-trio.metricsPort" -}}
{{- .own | default .root.Values.prometheus.port -}}
{{- end }}

{{/* A broker container of a sample Configuration (configurations.yaml): `broker` is its
brokerPod or brokerJob values. The `{{PLACEHOLDER}}` resource is upstream's. */}}
{{- define "akri-trio.brokerContainer" -}}
{{- $b := .broker -}}
{{- $image := $b.image | default dict -}}
name: {{ printf "%s-broker" .name }}
image: {{ printf "%s:%s" $image.repository ($image.tag | default "latest") | quote }}
{{- with $image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- with $b.command }}
command: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $b.env }}
env:
  {{- range $key, $value := . }}
  - name: {{ $key }}
    value: {{ $value | toString | quote }}
  {{- end }}
{{- end }}
{{- with $b.envFrom }}
envFrom:
  {{- range .secretRef }}
  - secretRef: {name: {{ . | quote }}}
  {{- end }}
  {{- range .configMapRef }}
  - configMapRef: {name: {{ . | quote }}}
  {{- end }}
{{- end }}
{{- with $b.securityContext }}
securityContext: {{- toYaml . | nindent 2 }}
{{- end }}
resources:
  requests:
    {{ "{{PLACEHOLDER}}" | quote }}: "1"
    {{- with $b.resources.memoryRequest }}
    memory: {{ . }}
    {{- end }}
    {{- with $b.resources.cpuRequest }}
    cpu: {{ . }}
    {{- end }}
  limits:
    {{ "{{PLACEHOLDER}}" | quote }}: "1"
    {{- with $b.resources.memoryLimit }}
    memory: {{ . }}
    {{- end }}
    {{- with $b.resources.cpuLimit }}
    cpu: {{ . }}
    {{- end }}
{{- $mounts := $b.volumeMounts | default list }}
{{- if .opcuaCerts }}
{{- $mounts = prepend $mounts (dict "name" "credentials" "mountPath" "/etc/opcua-certs/client-pki" "readOnly" false) }}
{{- end }}
{{- with $mounts }}
volumeMounts: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The label of the chart's sample Configurations, which the webhook does not judge (they are
created in the same install as the webhook, before it can answer). */}}
{{- define "akri-trio.sampleLabel" -}}
akri-trio.akri.sh/chart-sample
{{- end }}
