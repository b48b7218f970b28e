"""What Azure Event Grid sends: Microsoft's published samples, in arrays, and the validation
event; the sources that receive them (a query token, a key header)."""

from __future__ import annotations

from typing import Any

KEY = "eventgrid-key-0123456789"
TOKEN = "eventgrid-token-0123456789"
CONFIG: dict[str, Any] = {
    "sources": {
        "grid": {"kind": "eventgrid", "token": TOKEN},
        "grid-key": {"kind": "eventgrid", "key_header": "X-Grid-Key", "secrets": [KEY]},
    }
}
HEADERS = {"content-type": "application/json", "aeg-event-type": "Notification"}

# Microsoft's published sample (learn.microsoft.com, event-grid/event-schema).
BLOB_CREATED: dict[str, Any] = {
    "topic": "/subscriptions/{subscription-id}/resourceGroups/Storage/providers/"
    "Microsoft.Storage/storageAccounts/xstoretestaccount",
    "subject": "/blobServices/default/containers/oc2d2817345i200097container/blobs/"
    "oc2d2817345i20002296blob",
    "eventType": "Microsoft.Storage.BlobCreated",
    "eventTime": "2017-06-26T18:41:00.9584103Z",
    "id": "831e1650-001e-001b-66ab-eeb76e069631",
    "data": {
        "api": "PutBlockList",
        "clientRequestId": "6d79dbfb-0e37-4fc4-981f-442c9ca65760",
        "requestId": "831e1650-001e-001b-66ab-eeb76e000000",
        "eTag": "0x8D4BCC2E4835CD0",
        "contentType": "application/octet-stream",
        "contentLength": 524288,
        "blobType": "BlockBlob",
        "url": "https://oc2d2817345i60006.blob.core.windows.net/oc2d2817345i200097container/"
        "oc2d2817345i20002296blob",
        "sequencer": "00000000000004420000000000028963",
        "storageDiagnostics": {"batchId": "b68529f3-68cd-4744-baa4-3c0498ec19f0"},
    },
    "dataVersion": "",
    "metadataVersion": "1",
}
# Microsoft's published validation event (learn.microsoft.com, webhook-event-delivery).
VALIDATION: list[dict[str, Any]] = [
    {
        "id": "2d1781af-3a4c-4d7c-bd0c-e34b19da4e66",
        "topic": "/subscriptions/xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
        "subject": "",
        "data": {
            "validationCode": "512d38b6-c7b8-40c8-89fe-f46f9e9622b6",
            "validationUrl": "https://rp-eastus2.eventgrid.azure.net:553/eventsubscriptions/"
            "myeventsub/validate?id=0000000000-0000-0000-0000-00000000000000&t=2022-10-28T04:"
            "23:35.1981776Z&apiVersion=2018-05-01-preview&token=1A1A1A1A",
        },
        "eventType": "Microsoft.EventGrid.SubscriptionValidationEvent",
        "eventTime": "2022-10-28T04:23:35.1981776Z",
        "metadataVersion": "1",
        "dataVersion": "1",
    }
]


def event(event_id: str, event_type: str = "Contoso.Items.ItemReceived") -> dict[str, Any]:
    return {**BLOB_CREATED, "id": event_id, "eventType": event_type}
