from django import forms


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    comment = forms.CharField(required=False, max_length=2000, widget=forms.Textarea)


class RevokeForm(forms.Form):
    reason = forms.CharField(max_length=2000)


class ResolveForm(forms.Form):
    result = forms.ChoiceField(
        choices=[
            ("committed", "It happened (committed)"),
            ("not_found", "It did not happen"),
            ("still_unknown", "Still unknown: look again later"),
        ]
    )
    downstream_id = forms.CharField(required=False, max_length=255)
    note = forms.CharField(required=False, max_length=4000, widget=forms.Textarea)
    snooze_until = forms.DateTimeField(
        required=False,
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"],
        help_text="UTC",
    )


class NoteForm(forms.Form):
    note = forms.CharField(max_length=4000, widget=forms.Textarea)


class ConfirmForm(forms.Form):
    decision = forms.ChoiceField(choices=[("confirm", "Confirm"), ("dispute", "Dispute")])
    note = forms.CharField(required=False, max_length=4000, widget=forms.Textarea)
