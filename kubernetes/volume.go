package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/berth-sh/berth/backend"
)

// This file holds a sandbox's volume: with storage_class set, a
// PersistentVolumeClaim per sandbox (volumeName), mounted at its workdir, which
// outlives the Pod. A claim without a Pod is a stopped sandbox: Inspect and List
// report it from the claim, and Create makes the Pod again from the spec kept on
// it (AnnotationSpec).

// claimSpec returns the volume claim of the sandbox of spec: the config's storage
// class and volume_size, ReadWriteOnce (one node mounts it: the Pod's), and the
// spec itself in AnnotationSpec.
func claimSpec(spec backend.SandboxSpec, set settings, ns string) (*corev1.PersistentVolumeClaim, error) {
	labels, annotations := objectMeta(spec, set)
	stored, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("kubernetes sandbox %s: encoding its spec: %w", spec.Name, err)
	}
	annotations[AnnotationSpec] = string(stored)
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: volumeName(PodName(spec.Name)), Namespace: ns, Labels: labels, Annotations: annotations},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(set.cfg.StorageClass),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: set.volumeSize}},
		},
	}, nil
}

// ensureVolume returns the sandbox's volume claim. A claim of ours (the spec's
// owner) that is there already is a stopped sandbox's: it is returned with the
// spec it was made with (stored), which Create starts again. Otherwise, when the
// config has a storage class, a new claim is made (made true); without one, and
// no claim, claim is nil. A claim of that name that is not ours is ErrConflict,
// and one being deleted is waited for.
func (d *Driver) ensureVolume(ctx context.Context, cs *kubernetes.Clientset, ns string, spec backend.SandboxSpec, set settings) (claim *corev1.PersistentVolumeClaim, stored *backend.SandboxSpec, made bool, err error) {
	name := volumeName(PodName(spec.Name))
	for attempt := 0; ; attempt++ {
		have, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			if err := oursMeta(spec.Name, "PersistentVolumeClaim", &have.ObjectMeta, spec.Labels[backend.LabelOwner]); err != nil {
				return nil, nil, false, err
			}
			if have.DeletionTimestamp != nil {
				// Being removed (a Remove of the sandbox, whose Pod just went):
				// wait, then make it anew.
				if err := d.waitClaimGone(ctx, cs, ns, name); err != nil {
					return nil, nil, false, err
				}
				continue
			}
			var st backend.SandboxSpec
			if err := json.Unmarshal([]byte(have.Annotations[AnnotationSpec]), &st); err != nil || st.Name != spec.Name {
				return nil, nil, false, backend.Errorf(backend.ErrConflict, "kubernetes sandbox %s: its volume claim %s does not hold the spec it was made with (annotation %s); remove the sandbox (berth rm, or berth exec --recreate)", spec.Name, name, AnnotationSpec)
			}
			return have, &st, false, nil
		}
		if werr := d.wrap("get persistentvolumeclaim "+name, err); !errors.Is(werr, backend.ErrNotFound) {
			if set.cfg.StorageClass == "" && apierrors.IsForbidden(err) {
				return nil, nil, false, nil // no volumes configured, and none may be read: there is none of ours
			}
			return nil, nil, false, werr
		}
		if set.cfg.StorageClass == "" {
			return nil, nil, false, nil
		}
		c, err := claimSpec(spec, set, ns)
		if err != nil {
			return nil, nil, false, err
		}
		got, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, c, metav1.CreateOptions{})
		if err != nil {
			werr := d.wrap("create persistentvolumeclaim "+name, err)
			if errors.Is(werr, backend.ErrConflict) && attempt < 3 {
				continue // another process made it meanwhile: it is ours or refused above
			}
			return nil, nil, false, werr
		}
		return got, nil, true, nil
	}
}

// getClaim returns the volume claim of sandbox name, or ErrNotFound (also for a
// claim of that name that is not berth's sandbox name).
func (d *Driver) getClaim(ctx context.Context, name string) (*corev1.PersistentVolumeClaim, error) {
	cs, ns, err := d.client()
	if err != nil {
		return nil, err
	}
	vn := volumeName(PodName(name))
	c, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, vn, metav1.GetOptions{})
	if err != nil {
		werr := d.wrap("get persistentvolumeclaim "+vn, err)
		if apierrors.IsForbidden(err) && !d.volumes() {
			return nil, backend.Errorf(backend.ErrNotFound, "kubernetes sandbox %s: no Pod of that sandbox in namespace %s", name, ns)
		}
		return nil, werr
	}
	if c.Annotations[AnnotationSandbox] != name || c.Labels[LabelManagedBy] != "berth" {
		return nil, backend.Errorf(backend.ErrNotFound, "kubernetes sandbox %s: no volume claim of that sandbox in namespace %s (the claim %s is not berth's sandbox %s)", name, ns, vn, name)
	}
	return c, nil
}

// ifStopped returns, for err (ErrNotFound for the Pod of sandbox name), ErrConflict
// when the sandbox is stopped (its volume claim is there, its Pod is not), else
// err.
func (d *Driver) ifStopped(ctx context.Context, name string, err error) error {
	if !errors.Is(err, backend.ErrNotFound) {
		return err
	}
	if _, cerr := d.getClaim(ctx, name); cerr == nil {
		return backend.Errorf(backend.ErrConflict, "kubernetes sandbox %s is stopped (its volume claim %s has no Pod); the next exec starts it", name, volumeName(PodName(name)))
	}
	return err
}

// volumes reports whether the config has a storage class.
func (d *Driver) volumes() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.set.cfg.StorageClass != ""
}

// claimSandbox is the stopped sandbox of a volume claim without a Pod.
func claimSandbox(c *corev1.PersistentVolumeClaim) backend.Sandbox {
	sb := backend.Sandbox{Name: c.Annotations[AnnotationSandbox], ID: string(c.UID), State: backend.StateStopped,
		Labels: rawLabels(c.Annotations), CreatedAt: c.CreationTimestamp.UTC()}
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	return sb
}

// listClaims returns the stopped sandboxes of List: berth's volume claims whose
// labels contain filter and whose sandbox has no Pod (withPod).
func (d *Driver) listClaims(ctx context.Context, cs *kubernetes.Clientset, ns string, filter map[string]string, withPod map[string]bool) ([]backend.Sandbox, error) {
	list, err := cs.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{LabelSelector: selector(filter)})
	if err != nil {
		if apierrors.IsForbidden(err) && !d.volumes() {
			return nil, nil // no volumes configured, and none may be listed
		}
		return nil, d.wrap("list persistentvolumeclaims", err)
	}
	var out []backend.Sandbox
	for i := range list.Items {
		c := &list.Items[i]
		name := c.Annotations[AnnotationSandbox]
		labels := rawLabels(c.Annotations)
		if labels == nil || name == "" || withPod[name] || c.Labels[LabelManagedBy] != "berth" || !backend.MatchLabels(labels, filter) {
			continue
		}
		out = append(out, claimSandbox(c))
	}
	return out, nil
}

// removeClaim deletes the volume claim of sandbox name, when there is one of
// berth's sandbox name, and waits until it is gone (the claim goes once no Pod
// uses it; the volume with it, by the storage class's reclaim policy).
func (d *Driver) removeClaim(ctx context.Context, name string) error {
	c, err := d.getClaim(ctx, name)
	if errors.Is(err, backend.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	cs, ns, err := d.client()
	if err != nil {
		return err
	}
	return d.deleteClaim(ctx, cs, ns, c.Name, c.UID)
}

// deleteClaim deletes the claim name of UID uid and waits until it is gone. A
// missing claim succeeds.
func (d *Driver) deleteClaim(ctx context.Context, cs *kubernetes.Clientset, ns, name string, uid types.UID) error {
	err := cs.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if werr := d.wrap("delete persistentvolumeclaim "+name, err); err != nil && !errors.Is(werr, backend.ErrNotFound) && !errors.Is(werr, backend.ErrConflict) {
		return werr
	}
	return d.waitClaimGone(ctx, cs, ns, name)
}

// waitClaimGone watches the claim name until it no longer exists.
func (d *Driver) waitClaimGone(ctx context.Context, cs *kubernetes.Clientset, ns, name string) error {
	claims := cs.CoreV1().PersistentVolumeClaims(ns)
	return d.waitDeleted(ctx, "persistentvolumeclaim "+name,
		func(ctx context.Context) (string, error) {
			c, err := claims.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return "", err
			}
			return c.ResourceVersion, nil
		},
		func(ctx context.Context, rv string) (watch.Interface, error) {
			return claims.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: rv})
		})
}

// waitDeleted waits until the object what no longer exists: get returns its
// resource version (or the API's error; not found ends the wait), and watch
// watches it from there until a Deleted event; a watch that ends otherwise (its
// timeout, an API server restart) is followed by another look.
func (d *Driver) waitDeleted(ctx context.Context, what string, get func(context.Context) (string, error), watchFrom func(context.Context, string) (watch.Interface, error)) error {
	for {
		rv, err := get(ctx)
		if werr := d.wrap("get "+what, err); errors.Is(werr, backend.ErrNotFound) {
			return nil
		} else if err != nil {
			return werr
		}
		w, err := watchFrom(ctx, rv)
		if err != nil {
			return d.wrap("watch "+what, err)
		}
		gone := false
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				gone = true
				break
			}
		}
		w.Stop()
		if gone {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("kubernetes: waiting for %s to be deleted: %w", what, ctx.Err())
		}
	}
}
