package kubernetes

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/containerutil"
)

// DefaultStopGrace is Stop's grace when the caller passes 0.
const DefaultStopGrace = time.Second

// cleanupTimeout bounds the clean-up of a failed Create and the wait for a deleted
// Pod to be gone.
const cleanupTimeout = time.Minute

// fatalWaiting are the waiting reasons of a container that waiting does not mend:
// Create then fails with the reason and removes the Pod.
var fatalWaiting = map[string]bool{
	"ErrImageNeverPull": true, "ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true,
	"CrashLoopBackOff": true, "PreCreateHookError": true, "PreStartHookError": true,
}

// Create makes the sandbox's Pod (and the Secret holding its agent token, and with
// storage_class its volume claim) and waits until its agent answers through a
// port-forward, or adopts the Pod of that name when it carries the same owner
// (waiting for it when it is still starting). A stopped sandbox (its volume claim
// without a Pod) is started: its Pod is made again on the claim from the spec
// kept there, and returned Adopted with the same ID. A Pod or claim of that name
// that is not ours is ErrConflict and is never touched. A Pod that ended (its
// agent exited, evicted, OOM-killed, its node lost) is removed and made anew: its
// volume survives, nothing else does. A failed Create removes what it made (a
// stopped sandbox's claim stays): a container that cannot start (an image absent
// with pull "never", a bad image name) fails at once with its waiting reason and
// message.
func (d *Driver) Create(ctx context.Context, req backend.CreateRequest) (backend.Sandbox, error) {
	spec := req.Spec
	if err := backend.ValidateSandboxName(spec.Name); err != nil {
		return backend.Sandbox{}, err
	}
	if req.Agent.Dir == "" {
		return backend.Sandbox{}, backend.Errorf(backend.ErrInvalid, "kubernetes sandbox %s: no agent dir given (it holds the sandbox's agent token)", spec.Name)
	}
	token, err := agent.ReadToken(req.Agent.Dir)
	if err != nil {
		return backend.Sandbox{}, backend.Errorf(backend.ErrInvalid, "kubernetes sandbox %s: %w", spec.Name, err)
	}
	cs, ns, err := d.client()
	if err != nil {
		return backend.Sandbox{}, err
	}
	d.mu.Lock()
	set := d.set
	d.mu.Unlock()
	pod, secret, user, err := d.podSpec(spec, set, ns, token)
	if err != nil {
		return backend.Sandbox{}, err
	}
	lk := d.creating.Lock(spec.Name) // other processes: settled by the API server (names are unique; the loser adopts)
	lk.Lock()
	defer lk.Unlock()

	var ended backend.Sandbox // the Pod that had ended, for the new Pod's EndReason
	for attempt := 0; ; attempt++ {
		have, err := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil {
			sb, retry, err := d.adopt(ctx, spec, have, set.startTimeout, user)
			if !retry || attempt >= 3 {
				return sb, err
			}
			if e := toSandbox(have); e.EndReason != "" {
				ended = e
			}
			continue // the Pod had ended and is gone now: make it anew
		}
		if err = d.wrap("get pod "+pod.Name, err); !errors.Is(err, backend.ErrNotFound) {
			return backend.Sandbox{}, err
		}
		// The volume: a stopped sandbox's (its Pod is made again from the spec it
		// was made with), a new one (storage_class set), or none.
		claim, stored, madeClaim, err := d.ensureVolume(ctx, cs, ns, spec, set)
		if err != nil {
			return backend.Sandbox{}, err
		}
		pod, secret, user := pod, secret, user
		if stored != nil {
			s := set
			if s.cfg.StorageClass == "" {
				s.cfg.StorageClass = ptr.Deref(claim.Spec.StorageClassName, "(the claim's)")
			}
			if pod, secret, user, err = d.podSpec(*stored, s, ns, token); err != nil {
				return backend.Sandbox{}, fmt.Errorf("starting the stopped sandbox from the spec kept on its volume claim %s: %w", claim.Name, err)
			}
		}
		drop := func() {
			d.cleanup(ctx, cs, ns, pod.Name, secret.Name)
			if madeClaim {
				d.cleanupClaim(ctx, cs, ns, claim)
			}
		}
		if claim != nil {
			pod.Annotations[AnnotationVolumeUID] = string(claim.UID)
		}
		if err := d.putSecret(ctx, cs, ns, secret); err != nil {
			drop()
			return backend.Sandbox{}, err
		}
		made, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			werr := d.wrap("create pod "+pod.Name, err)
			if errors.Is(werr, backend.ErrConflict) && attempt < 3 {
				continue // another process created it meanwhile: adopt it
			}
			drop()
			return backend.Sandbox{}, werr
		}
		// The Secret goes with the Pod when the Pod is deleted behind berth's back
		// (the garbage collector follows the owner reference).
		d.ownSecret(ctx, cs, ns, secret.Name, made)
		sb, err := d.waitAgent(ctx, spec.Name, made, set.startTimeout, user, token)
		if err != nil {
			drop()
			return backend.Sandbox{}, err
		}
		sb.Adopted = stored != nil
		sb.EndReason, sb.EndMessage = ended.EndReason, ended.EndMessage
		return sb, nil
	}
}

// putSecret creates the token Secret, replacing one left by an earlier Pod of the
// name (a Secret whose Pod is gone: a Create killed midway, a Pod deleted behind
// berth's back before the garbage collector came) when it is ours.
func (d *Driver) putSecret(ctx context.Context, cs *kubernetes.Clientset, ns string, s *corev1.Secret) error {
	_, err := cs.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{})
	if err == nil {
		return nil
	}
	if werr := d.wrap("create secret "+s.Name, err); !errors.Is(werr, backend.ErrConflict) {
		return werr
	}
	old, err := cs.CoreV1().Secrets(ns).Get(ctx, s.Name, metav1.GetOptions{})
	if err != nil {
		werr := d.wrap("get secret "+s.Name, err)
		if errors.Is(werr, backend.ErrNotFound) {
			// Gone since the create: the garbage collector deleted the Secret of
			// the ended Pod it belonged to in between. The name is free now.
			_, err = cs.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{})
			return d.wrap("create secret "+s.Name, err)
		}
		return werr
	}
	if old.Labels[LabelManagedBy] != "berth" || old.Annotations[AnnotationSandbox] != s.Annotations[AnnotationSandbox] {
		return backend.Errorf(backend.ErrConflict, "kubernetes sandbox %s: a Secret %s exists in namespace %s that berth did not make; berth leaves it alone: remove or rename it", s.Annotations[AnnotationSandbox], s.Name, ns)
	}
	if err := cs.CoreV1().Secrets(ns).Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &old.UID}}); err != nil {
		if werr := d.wrap("delete secret "+s.Name, err); !errors.Is(werr, backend.ErrNotFound) {
			return werr
		}
	}
	_, err = cs.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{})
	return d.wrap("create secret "+s.Name, err)
}

// ownSecret makes Pod p the owner of the Secret name. Failing is harmless (Remove
// deletes the Secret itself), so it is not an error.
func (d *Driver) ownSecret(ctx context.Context, cs *kubernetes.Clientset, ns, name string, p *corev1.Pod) {
	patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":%q,"uid":%q}]}}`, p.Name, p.UID)
	cs.CoreV1().Secrets(ns).Patch(ctx, name, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{})
}

// cleanup deletes the Pod and the Secret of a failed Create and waits until the
// Pod is gone, so that the name is free again.
func (d *Driver) cleanup(ctx context.Context, cs *kubernetes.Clientset, ns, pod, secret string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	d.deletePod(ctx, cs, ns, pod, 0)
	cs.CoreV1().Secrets(ns).Delete(ctx, secret, metav1.DeleteOptions{})
}

// cleanupClaim deletes the volume claim that a failed Create made and waits until
// it is gone.
func (d *Driver) cleanupClaim(ctx context.Context, cs *kubernetes.Clientset, ns string, c *corev1.PersistentVolumeClaim) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	d.deleteClaim(ctx, cs, ns, c.Name, c.UID)
}

// deletePod deletes Pod name (grace seconds for the kubelet to end it; 0 is the
// smallest Kubernetes honours without force, 1 second) and waits until it is gone.
// A missing Pod succeeds.
func (d *Driver) deletePod(ctx context.Context, cs *kubernetes.Clientset, ns, name string, grace int64) error {
	if grace < 1 {
		grace = 1
	}
	err := cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(grace)})
	if werr := d.wrap("delete pod "+name, err); err != nil && !errors.Is(werr, backend.ErrNotFound) {
		return werr
	}
	return d.waitGone(ctx, cs, ns, name)
}

// waitGone watches Pod name until it no longer exists.
func (d *Driver) waitGone(ctx context.Context, cs *kubernetes.Clientset, ns, name string) error {
	pods := cs.CoreV1().Pods(ns)
	return d.waitDeleted(ctx, "pod "+name,
		func(ctx context.Context) (string, error) {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return "", err
			}
			return p.ResourceVersion, nil
		},
		func(ctx context.Context, rv string) (watch.Interface, error) {
			return pods.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: rv})
		})
}

// adopt takes over Pod p of the spec's name when it is ours. retry reports that
// the Pod had ended and was removed: the caller makes it anew.
func (d *Driver) adopt(ctx context.Context, spec backend.SandboxSpec, p *corev1.Pod, timeout time.Duration, user string) (sb backend.Sandbox, retry bool, err error) {
	if err := ours(spec.Name, p, spec.Labels[backend.LabelOwner]); err != nil {
		return backend.Sandbox{}, false, err
	}
	cs, ns, err := d.client()
	if err != nil {
		return backend.Sandbox{}, false, err
	}
	if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		// Ended (its agent shut down, evicted, OOM-killed, its node lost) or being
		// deleted: nothing of it can be started again.
		if err := d.deletePod(ctx, cs, ns, p.Name, 1); err != nil {
			return backend.Sandbox{}, false, err
		}
		return backend.Sandbox{}, true, nil
	}
	token, err := d.token(ctx, p)
	if err != nil {
		return backend.Sandbox{}, false, err
	}
	if u, ok := p.Annotations[AnnotationUser]; ok {
		user = u
	}
	sb, err = d.waitAgent(ctx, spec.Name, p, timeout, user, token)
	if err != nil {
		return backend.Sandbox{}, false, err
	}
	sb.Adopted = true
	return sb, false, nil
}

// ours returns ErrConflict unless Pod p is berth's sandbox name of owner (any
// berth owner when owner is "").
func ours(name string, p *corev1.Pod, owner string) error {
	return oursMeta(name, "Pod", &p.ObjectMeta, owner)
}

// oursMeta returns ErrConflict unless the object m of kind (a Pod, a
// PersistentVolumeClaim) is berth's sandbox name of owner (any berth owner when
// owner is "").
func oursMeta(name, kind string, m *metav1.ObjectMeta, owner string) error {
	labels := rawLabels(m.Annotations)
	have, ok := labels[backend.LabelOwner]
	switch {
	case !ok:
		return backend.Errorf(backend.ErrConflict, "kubernetes sandbox %s: a %s %s exists in namespace %s and has no berth labels (not made by berth); berth leaves it alone: remove or rename it, or use another session", name, kind, m.Name, m.Namespace)
	case m.Annotations[AnnotationSandbox] != name:
		return backend.Errorf(backend.ErrConflict, "kubernetes sandbox %s: the %s %s belongs to berth sandbox %q; berth leaves it alone", name, kind, m.Name, m.Annotations[AnnotationSandbox])
	case owner != "" && have != owner:
		return backend.Errorf(backend.ErrConflict, "kubernetes sandbox %s: a %s %s exists in namespace %s and belongs to berth owner %q, not %q; berth leaves it alone: remove it, or use another session", name, kind, m.Name, m.Namespace, have, owner)
	}
	return nil
}

// token reads the agent token of Pod p from its Secret.
func (d *Driver) token(ctx context.Context, p *corev1.Pod) ([]byte, error) {
	cs, ns, err := d.client()
	if err != nil {
		return nil, err
	}
	name := secretName(p.Name)
	s, err := cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		werr := d.wrap("get secret "+name, err)
		if errors.Is(werr, backend.ErrNotFound) {
			return nil, backend.Errorf(backend.ErrConflict, "kubernetes sandbox %s: the Secret %s holding its agent token is gone; remove the sandbox (berth exec --recreate)", p.Annotations[AnnotationSandbox], name)
		}
		return nil, werr
	}
	tok, err := hex.DecodeString(strings.TrimSpace(string(s.Data[tokenKey])))
	if err != nil || len(tok) == 0 {
		return nil, backend.Errorf(backend.ErrConflict, "kubernetes sandbox %s: the Secret %s does not hold an agent token; remove the sandbox (berth exec --recreate)", p.Annotations[AnnotationSandbox], name)
	}
	return tok, nil
}

// waitAgent watches Pod p until its sandbox container runs, then waits until its
// agent answers through a port-forward, within timeout; and checks the default
// exec user. A container that cannot start fails at once with its reason.
func (d *Driver) waitAgent(ctx context.Context, name string, p *corev1.Pod, timeout time.Duration, user string, token []byte) (backend.Sandbox, error) {
	cs, ns, err := d.client()
	if err != nil {
		return backend.Sandbox{}, err
	}
	wctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("the Pod did not start within start_timeout %s", timeout))
	defer cancel()
	for !containerRunning(p) {
		if err := podProblem(name, p); err != nil {
			return backend.Sandbox{}, err
		}
		w, err := cs.CoreV1().Pods(ns).Watch(wctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", p.Name).String(), ResourceVersion: p.ResourceVersion})
		if err != nil {
			if wctx.Err() != nil {
				return backend.Sandbox{}, startTimeout(name, p, context.Cause(wctx))
			}
			return backend.Sandbox{}, d.wrap("watch pod "+p.Name, err)
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				w.Stop()
				return backend.Sandbox{}, backend.Errorf(backend.ErrUnavailable, "kubernetes sandbox %s: the Pod %s was deleted while starting", name, p.Name)
			}
			if np, ok := ev.Object.(*corev1.Pod); ok && (ev.Type == watch.Modified || ev.Type == watch.Added) {
				p = np
				if containerRunning(p) || podProblem(name, p) != nil {
					break
				}
			}
		}
		w.Stop()
		if wctx.Err() != nil {
			return backend.Sandbox{}, startTimeout(name, p, context.Cause(wctx))
		}
		if !containerRunning(p) && podProblem(name, p) == nil {
			// The watch ended (its timeout, an API server restart): read the Pod
			// again and watch on.
			if np, err := cs.CoreV1().Pods(ns).Get(wctx, p.Name, metav1.GetOptions{}); err == nil {
				p = np
			}
		}
	}
	// While the agent is dialled, a container that ends (the agent failed) ends
	// the wait at once with the container's termination message.
	rctx, stop := context.WithCancelCause(wctx)
	defer stop(nil)
	go d.watchProblem(rctx, stop, name, p)
	c, err := agent.WaitReady(rctx, func(ctx context.Context) (net.Conn, error) { return d.forward(ctx, p) }, agent.WithToken(token))
	if err != nil {
		if ctx.Err() != nil {
			return backend.Sandbox{}, fmt.Errorf("kubernetes sandbox %s: waiting for the agent: %w", name, ctx.Err())
		}
		if cause := context.Cause(rctx); backend.KindOf(cause) != nil {
			return backend.Sandbox{}, cause
		}
		return backend.Sandbox{}, backend.Errorf(backend.ErrUnavailable, "kubernetes sandbox %s: the agent in Pod %s did not answer through a port-forward to port %d within %s: %w", name, p.Name, AgentPort, timeout, err)
	}
	defer c.Close()
	if err := containerutil.CheckUser(ctx, c, Name, name, user); err != nil {
		return backend.Sandbox{}, err
	}
	return toSandbox(p), nil
}

// watchProblem watches Pod p until ctx ends and calls stop with podProblem's error
// as soon as the Pod has one.
func (d *Driver) watchProblem(ctx context.Context, stop context.CancelCauseFunc, name string, p *corev1.Pod) {
	cs, ns, err := d.client()
	if err != nil {
		return
	}
	rv := p.ResourceVersion
	for ctx.Err() == nil {
		w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", p.Name).String(), ResourceVersion: rv})
		if err != nil {
			return
		}
		for ev := range w.ResultChan() {
			np, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			rv = np.ResourceVersion
			if err := podProblem(name, np); err != nil || ev.Type == watch.Deleted {
				if err == nil {
					err = backend.Errorf(backend.ErrUnavailable, "kubernetes sandbox %s: the Pod %s was deleted while starting", name, p.Name)
				}
				w.Stop()
				stop(err)
				return
			}
		}
		w.Stop()
	}
}

// startTimeout is waitAgent's error when the Pod did not start in time, with what
// the Pod's status says (unschedulable, pulling).
func startTimeout(name string, p *corev1.Pod, cause error) error {
	why := string(p.Status.Phase)
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			why += "; " + string(c.Type) + ": " + c.Reason + ": " + c.Message
		}
	}
	for _, s := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if w := s.State.Waiting; w != nil {
			why += fmt.Sprintf("; container %s waiting: %s %s", s.Name, w.Reason, w.Message)
		}
	}
	return backend.Errorf(backend.ErrTimeout, "kubernetes sandbox %s: %w (Pod %s: %s)", name, cause, p.Name, why)
}

// containerRunning reports whether the sandbox container of p runs.
func containerRunning(p *corev1.Pod) bool {
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == ContainerName {
			return s.State.Running != nil
		}
	}
	return false
}

// podProblem returns the error of a Pod that will not start: ended, an init
// container that failed, a container waiting for a reason waiting does not mend
// (fatalWaiting). The error wraps ErrNotFound for a missing image, ErrInvalid
// otherwise, and carries the reason and message Kubernetes gives.
func podProblem(name string, p *corev1.Pod) error {
	for _, s := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if w := s.State.Waiting; w != nil && fatalWaiting[w.Reason] {
			kind := backend.ErrInvalid
			hint := ""
			switch w.Reason {
			case "ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff":
				kind = backend.ErrNotFound
				hint = "; load the image into the node's container runtime (ctr -n k8s.io images import FILE), or let the node pull it: pull = \"missing\" in the scope rule (image_pull_policy in driver \"kubernetes\" {} for the agent image)"
			}
			return backend.Errorf(kind, "kubernetes sandbox %s: container %s of Pod %s cannot start: %s: %s%s", name, s.Name, p.Name, w.Reason, w.Message, hint)
		}
		if t := s.State.Terminated; t != nil && (t.ExitCode != 0 || s.Name == ContainerName) {
			return backend.Errorf(backend.ErrUnavailable, "kubernetes sandbox %s: container %s of Pod %s ended (%s, exit code %d) before the agent answered: %s", name, s.Name, p.Name, t.Reason, t.ExitCode, strings.TrimSpace(t.Message))
		}
	}
	if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
		return backend.Errorf(backend.ErrUnavailable, "kubernetes sandbox %s: Pod %s ended (%s: %s %s)", name, p.Name, p.Status.Phase, p.Status.Reason, p.Status.Message)
	}
	if p.DeletionTimestamp != nil {
		return backend.Errorf(backend.ErrUnavailable, "kubernetes sandbox %s: Pod %s is being deleted", name, p.Name)
	}
	return nil
}

// toSandbox converts a Pod: running while its sandbox container runs, created
// while it is pending, stopped once ended (with why: endOf). Its ID is its volume
// claim's UID (AnnotationVolumeUID), which outlives the Pod, else the Pod's.
func toSandbox(p *corev1.Pod) backend.Sandbox {
	id := p.Annotations[AnnotationVolumeUID]
	if id == "" {
		id = string(p.UID)
	}
	sb := backend.Sandbox{Name: p.Annotations[AnnotationSandbox], ID: id, State: backend.StateStopped,
		Labels: rawLabels(p.Annotations), CreatedAt: p.CreationTimestamp.UTC()}
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	switch {
	case p.DeletionTimestamp != nil:
	case p.Status.Phase == corev1.PodRunning && containerRunning(p):
		sb.State = backend.StateRunning
	case p.Status.Phase == corev1.PodPending:
		sb.State = backend.StateCreated
	}
	if sb.State == backend.StateStopped {
		sb.EndReason, sb.EndMessage = endOf(p)
	}
	return sb
}

// disruptionTarget is the Pod condition that Kubernetes sets on a Pod it is about
// to end for a disruption (an eviction, a preemption, a taint, the Pod garbage
// collector, the kubelet).
const disruptionTarget corev1.PodConditionType = "DisruptionTarget"

// endOf says why Pod p, which is not running (ended, or being deleted), ended,
// as backend.Sandbox's EndReason and EndMessage: the Pod's status reason and
// message, set by the kubelet (Evicted: "The node was low on resource: memory",
// "Usage of EmptyDir volume ... exceeds the limit"; Shutdown, NodeAffinity, ...);
// else its DisruptionTarget condition (the eviction API: Evicted; a preemption,
// a taint or the Pod garbage collector: their reasons); else the sandbox
// container's terminated reason (OOMKilled, Error, Completed, set by the container
// runtime) with its exit code. The container's termination message is not used:
// the sandbox writes it. Empty when the Pod does not say, and for a Pod being
// deleted without a disruption condition (berth's Stop or Remove, or someone's
// kubectl delete: Kubernetes does not say whose), whose container ends because of
// the deletion.
func endOf(p *corev1.Pod) (reason, message string) {
	clean := backend.SanitizeEndMessage
	if p.Status.Reason != "" {
		return clean(p.Status.Reason), clean(p.Status.Message)
	}
	for _, c := range p.Status.Conditions {
		if c.Type != disruptionTarget || c.Status != corev1.ConditionTrue {
			continue
		}
		if c.Reason == "EvictionByEvictionAPI" {
			return backend.EndEvicted, clean(c.Message)
		}
		return clean(c.Reason), clean(c.Message)
	}
	if p.DeletionTimestamp != nil {
		return "", ""
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.Name != ContainerName || s.State.Terminated == nil {
			continue
		}
		t := s.State.Terminated
		reason = t.Reason
		if reason == "" {
			reason = backend.EndError
			if t.ExitCode == 0 {
				reason = backend.EndCompleted
			}
		}
		what := fmt.Sprintf("the sandbox container's agent exited with code %d", t.ExitCode)
		if t.Signal != 0 {
			what = fmt.Sprintf("the sandbox container's agent was killed by signal %d", t.Signal)
		}
		return clean(reason), what
	}
	return "", ""
}

// get returns the Pod of sandbox name, or ErrNotFound (also for a Pod of that
// name that belongs to another sandbox name, or to no berth sandbox at all: it is
// not this sandbox).
func (d *Driver) get(ctx context.Context, name string) (*corev1.Pod, error) {
	if err := backend.ValidateSandboxName(name); err != nil {
		return nil, err
	}
	cs, ns, err := d.client()
	if err != nil {
		return nil, err
	}
	p, err := cs.CoreV1().Pods(ns).Get(ctx, PodName(name), metav1.GetOptions{})
	if err != nil {
		return nil, d.wrap("get pod "+PodName(name), err)
	}
	if p.Annotations[AnnotationSandbox] != name {
		return nil, backend.Errorf(backend.ErrNotFound, "kubernetes sandbox %s: no Pod of that sandbox in namespace %s (the Pod %s is not berth's sandbox %s)", name, ns, p.Name, name)
	}
	return p, nil
}

// Inspect returns the sandbox's state, or ErrNotFound: its Pod's, or stopped when
// it has a volume claim and no Pod.
func (d *Driver) Inspect(ctx context.Context, name string) (backend.Sandbox, error) {
	p, err := d.get(ctx, name)
	if err == nil {
		return toSandbox(p), nil
	}
	if !errors.Is(err, backend.ErrNotFound) {
		return backend.Sandbox{}, err
	}
	c, cerr := d.getClaim(ctx, name)
	if errors.Is(cerr, backend.ErrNotFound) {
		return backend.Sandbox{}, err
	}
	if cerr != nil {
		return backend.Sandbox{}, cerr
	}
	return claimSandbox(c), nil
}

// List returns berth's sandboxes (Pods and volume claims with a berth.owner label;
// a claim without a Pod is a stopped sandbox) in the namespace whose labels
// contain filter: selected by the API server on the mapped labels (labelKey,
// labelValue), then compared on the labels as given (AnnotationLabels).
func (d *Driver) List(ctx context.Context, filter map[string]string) ([]backend.Sandbox, error) {
	cs, ns, err := d.client()
	if err != nil {
		return nil, err
	}
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector(filter)})
	if err != nil {
		return nil, d.wrap("list pods", err)
	}
	var out []backend.Sandbox
	withPod := map[string]bool{}
	for i := range list.Items {
		p := &list.Items[i]
		labels := rawLabels(p.Annotations)
		if labels == nil || p.Annotations[AnnotationSandbox] == "" || !backend.MatchLabels(labels, filter) {
			continue
		}
		withPod[p.Annotations[AnnotationSandbox]] = true
		out = append(out, toSandbox(p))
	}
	stopped, err := d.listClaims(ctx, cs, ns, filter, withPod)
	if err != nil {
		return nil, err
	}
	return append(out, stopped...), nil
}

// Stop asks the agent to end every process (SIGTERM, SIGKILL after grace) and
// exit, then deletes the Pod and its token Secret and waits until the Pod is gone:
// a Pod cannot be stopped. The sandbox's volume claim, when it has one, is kept:
// the sandbox is stopped, and Create makes its Pod again on it; without one stop
// means remove (Capabilities.StopStart false). A missing or stopped sandbox
// succeeds; a Pod that is not berth's is ErrConflict.
func (d *Driver) Stop(ctx context.Context, name string, grace time.Duration) error {
	if grace <= 0 {
		grace = DefaultStopGrace
	}
	p, err := d.get(ctx, name)
	if errors.Is(err, backend.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := ours(name, p, ""); err != nil {
		return err
	}
	if containerRunning(p) && p.DeletionTimestamp == nil {
		if tok, err := d.token(ctx, p); err == nil {
			sctx, cancel := context.WithTimeout(ctx, grace+3*time.Second)
			if c, err := agent.NewClient(sctx, func(ctx context.Context) (net.Conn, error) { return d.forward(ctx, p) }, agent.WithToken(tok)); err == nil {
				c.Shutdown(sctx, grace)
				c.Close()
			}
			cancel()
		}
	}
	return d.remove(ctx, p, int64(grace/time.Second))
}

// Remove deletes the sandbox's Pod and token Secret, waits until the Pod is gone,
// then deletes its volume claim and waits until that is gone too. A missing
// sandbox succeeds; a Pod that is not berth's is ErrConflict.
func (d *Driver) Remove(ctx context.Context, name string) error {
	p, err := d.get(ctx, name)
	switch {
	case errors.Is(err, backend.ErrNotFound):
	case err != nil:
		return err
	default:
		if err := ours(name, p, ""); err != nil {
			return err
		}
		if err := d.remove(ctx, p, 1); err != nil {
			return err
		}
	}
	return d.removeClaim(ctx, name)
}

// remove deletes Pod p (grace seconds) and its Secret, and waits for the Pod to go.
func (d *Driver) remove(ctx context.Context, p *corev1.Pod, grace int64) error {
	cs, ns, err := d.client()
	if err != nil {
		return err
	}
	d.pool.drop(p.Name)
	if err := d.deletePod(ctx, cs, ns, p.Name, grace); err != nil {
		return err
	}
	err = cs.CoreV1().Secrets(ns).Delete(ctx, secretName(p.Name), metav1.DeleteOptions{})
	if werr := d.wrap("delete secret "+secretName(p.Name), err); err != nil && !errors.Is(werr, backend.ErrNotFound) {
		return werr
	}
	return nil
}

// Validate implements backend.Validator: it checks spec as Create does before it
// asks the API server anything (podSpec's checks); it does not check that the
// images are on the nodes. Errors wrap backend.ErrInvalid or ErrUnsupported and
// name the input.
func (d *Driver) Validate(ctx context.Context, spec backend.SandboxSpec) error {
	if err := backend.ValidateSandboxName(spec.Name); err != nil {
		return err
	}
	d.mu.Lock()
	set := d.set
	d.mu.Unlock()
	_, _, _, err := d.podSpec(spec, set, "", nil)
	return err
}
