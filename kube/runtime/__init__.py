"""The runtime every component runs on: what keeps a process in step with the cluster.

`informer` lists and watches one resource type into a local store (relist on expiry, bookmarks,
backoff, optional indexes); `workqueue` hands keys to workers once each, with per-key backoff;
`leader` elects one active replica through a Lease and fences its writes; `policymirror` mirrors
the objects GPU policies are made of into a builder the component brings. Everything here talks
to Kubernetes only through the cluster port and knows nothing of translation, allocation,
policies' meaning or devices: the components bring that logic and call in.
"""
